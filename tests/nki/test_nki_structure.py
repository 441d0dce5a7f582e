"""Structure of torchneuron/nki (issue 17): every module imports at its top, the package's
module-level imports form no cycle, and no module uses another module's private (``_name``)
helpers - shared helpers live under public names in the module whose job they are
(``isa/core.py``, ``language/core.py``, ``context.py``, ...)."""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
NKI = ROOT / "torchneuron" / "nki"
NKI_MODULES = sorted(NKI.rglob("*.py"))


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _is_module(dotted: str) -> bool:
    path = ROOT.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _absolute(node: ast.ImportFrom, path: pathlib.Path) -> str:
    """The module an ``import from`` names, with relative imports resolved against ``path``."""
    if not node.level:
        return node.module or ""
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    base = package[:len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def private_uses(text: str, path: pathlib.Path) -> list[str]:
    """``from torchneuron... import _x`` and ``module._x`` of torchneuron modules, anywhere in ``text``
    (the source of ``path``, against which relative imports resolve)."""
    tree = ast.parse(text)
    modules: set[str] = set()  # local names bound to torchneuron modules
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = _absolute(node, path)
            if not source.startswith("torchneuron"):
                continue
            for alias in node.names:
                if _is_module(f"{source}.{alias.name}"):
                    modules.add(alias.asname or alias.name)
                elif _is_private(alias.name):
                    found.append(f"line {node.lineno}: from {source} import {alias.name}")
        elif isinstance(node, ast.Import):
            modules |= {a.asname for a in node.names if a.asname and a.name.startswith("torchneuron")}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                and _is_private(node.attr)):
            found.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
    return sorted(found)


@pytest.mark.parametrize("path", NKI_MODULES, ids=lambda p: str(p.relative_to(NKI)))
def test_no_nki_module_uses_another_modules_private_helpers(path):
    uses = private_uses(path.read_text(), path)
    assert uses == [], (f"{path.relative_to(NKI)} uses private names of other modules: {uses}; give the helper "
                        "a public name in the module whose job it is")


def test_the_private_check_sees_imports_relative_imports_and_attributes():
    text = ("from torchneuron.nki.isa.core import _gone, record\n"
            "from torchneuron.nki import context\nfrom . import core\n\n\n"
            "def f():\n    from torchneuron.nki.language import legacy\n"
            "    return context._local, core._x, legacy._y, context.current_program(), core.__name__\n")
    uses = private_uses(text, NKI / "language" / "example.py")
    assert uses == ["line 1: from torchneuron.nki.isa.core import _gone", "line 8: context._local",
                    "line 8: core._x", "line 8: legacy._y"]


@pytest.mark.parametrize("path", NKI_MODULES, ids=lambda p: str(p.relative_to(NKI)))
def test_nki_modules_import_at_the_top(path):
    """Imports precede every other top-level statement (after the docstring); call-time imports inside
    functions are allowed (they load ``nki.isa`` lazily or break a dependency that would be a cycle)."""
    body = ast.parse(path.read_text()).body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    first_other = None
    late = []
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if first_other is not None:
                late.append(node.lineno)
        elif not (isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")):
            first_other = node.lineno if first_other is None else first_other
    assert late == [], (f"{path.relative_to(NKI)} imports at lines {late}, below its first other statement "
                        f"(line {first_other}); move the imports to the top")


def _complexity(fn: ast.FunctionDef) -> int:
    """McCabe-style decision count of ``fn`` (branches, loops, handlers, ternaries, comprehension clauses and
    each extra ``and``/``or`` operand, nested functions included)."""
    count = 1
    for node in ast.walk(fn):
        if isinstance(node, (ast.If, ast.For, ast.While, ast.IfExp, ast.ExceptHandler, ast.Assert)):
            count += 1
        elif isinstance(node, ast.comprehension):
            count += 1 + len(node.ifs)
        elif isinstance(node, ast.BoolOp):
            count += len(node.values) - 1
    return count


@pytest.mark.parametrize("name", ["nc_matmul", "accumulate_matmul_result"])
def test_matmul_entry_points_delegate_to_one_job_helpers(name):
    """nc_matmul was one 150-line function of complexity 62 (and the legacy ``+=`` folding 59 lines of 31):
    each is now a short sequence of named steps (checks, shape, values, record), each a helper."""
    tree = ast.parse((NKI / "isa" / "tensor_ops.py").read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    assert _complexity(fn) <= 10, f"{name} has complexity {_complexity(fn)}: move a job into a helper"
    assert fn.end_lineno - fn.lineno < 40, f"{name} is {fn.end_lineno - fn.lineno + 1} lines long"


def test_nki_module_level_imports_form_no_cycle():
    modules = {_module_name(p): p for p in NKI_MODULES}
    edges: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.parse(path.read_text()).body:  # module level only: call-time imports are not cycles
            if isinstance(node, ast.ImportFrom) and node.module:
                subs = {f"{node.module}.{a.name}" for a in node.names} & modules.keys()
                edges[name] |= subs
                if node.module in modules and len(subs) < len(node.names):
                    edges[name].add(node.module)
            elif isinstance(node, ast.Import):
                edges[name] |= {a.name for a in node.names} & modules.keys()
    state: dict[str, int] = {}  # 1 visiting, 2 done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for target in sorted(edges[name]):
            if state.get(target) == 1:
                cycle = path[path.index(target):] + [target] if target in path else [name, target]
                pytest.fail("module-level import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target, path + [target])
        state[name] = 2

    for name in sorted(modules):
        if name not in state:
            visit(name, [name])
