"""Structure of torchneuron/nki: every module imports at its top, the package's module-level
imports form no cycle, and the instruction modules of nki/isa share helpers through the
package's shared modules (_common, enums, accumulators), never through each other's private
names."""

from __future__ import annotations

import ast
import pathlib

import pytest

NKI = pathlib.Path(__file__).resolve().parents[2] / "torchneuron" / "nki"
ISA_SHARED = {"torchneuron.nki.isa._common", "torchneuron.nki.isa.enums", "torchneuron.nki.isa.accumulators"}
ISA_MODULES = sorted(p for p in (NKI / "isa").glob("*.py") if p.name != "__init__.py")
NKI_MODULES = sorted(NKI.rglob("*.py"))


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(NKI.parents[1]).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@pytest.mark.parametrize("path", ISA_MODULES, ids=lambda p: p.name)
def test_no_instruction_module_imports_a_siblings_private_helpers(path):
    tree = ast.parse(path.read_text())
    offenders = [
        f"{node.module}.{alias.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("torchneuron.nki.isa.")
        and node.module not in ISA_SHARED
        for alias in node.names if alias.name.startswith("_")
    ]
    assert offenders == [], f"{path.name} imports private helpers of sibling modules: {offenders}"


@pytest.mark.parametrize("path", NKI_MODULES, ids=lambda p: str(p.relative_to(NKI)))
def test_nki_modules_import_at_the_top(path):
    seen_definition = False
    late = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            seen_definition = True
        elif seen_definition and isinstance(node, (ast.Import, ast.ImportFrom)):
            late.append(node.lineno)
    assert late == [], f"{path.relative_to(NKI)} imports below its definitions at lines {late}"


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
