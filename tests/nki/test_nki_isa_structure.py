"""Structure of torchneuron/nki/isa: instruction modules share helpers through the package's
shared modules (_common, enums, accumulators), never through each other's private names, and
import at the top of the module."""

from __future__ import annotations

import ast
import pathlib

import pytest

ISA = pathlib.Path(__file__).resolve().parents[2] / "torchneuron" / "nki" / "isa"
SHARED = {"torchneuron.nki.isa._common", "torchneuron.nki.isa.enums", "torchneuron.nki.isa.accumulators"}
MODULES = sorted(p for p in ISA.glob("*.py") if p.name != "__init__.py")


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_no_instruction_module_imports_a_siblings_private_helpers(path):
    tree = ast.parse(path.read_text())
    offenders = [
        f"{node.module}.{alias.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("torchneuron.nki.isa.")
        and node.module not in SHARED
        for alias in node.names if alias.name.startswith("_")
    ]
    assert offenders == [], f"{path.name} imports private helpers of sibling modules: {offenders}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_instruction_modules_import_at_the_top(path):
    tree = ast.parse(path.read_text())
    seen_definition = False
    late = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            seen_definition = True
        elif seen_definition and isinstance(node, (ast.Import, ast.ImportFrom)):
            late.append(node.lineno)
    assert late == [], f"{path.name} imports below its definitions at lines {late}"
