"""The instruction registry: one declaration per ``nki.isa`` instruction.

Each instruction of :mod:`torchneuron.nki.isa` is declared once, where its semantics are
defined, with :func:`torchneuron.nki.isa.core.instruction`: the function that simulates
it, its legacy (result-returning) form, the NeuronCore version it needs (its legality hook)
and one cost formula per engine it can run on. The cost model
(:mod:`torchneuron.nki.cost.model`) finds an instruction's formula here and nowhere else,
so a new instruction is one declaration, and an instruction recorded on an engine without a
formula is an :class:`NkiCostFormulaError` instead of a silent rule of thumb.

This module holds only the table; it imports no simulator module, so the cost model can
read it without importing the instruction set (which registers itself on first import).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Mapping, Union

if TYPE_CHECKING:  # annotations only: the cost model imports this module
    from torchneuron.nki.cost.model import InstructionCost, CostModel
    from torchneuron.nki.instruction import Instruction

__all__ = ["CostFormula", "InstructionSpec", "NkiCostFormulaError", "register", "spec", "specs", "cost_formula"]

# A formula takes the instruction record and the cost model (its ``gen``, clocks and DMA
# rates) and returns (cycles of the engine clock, the formula's text), or, for transfers
# the model itself times, a finished InstructionCost.
CostFormula = Callable[["Instruction", "CostModel"], Union[tuple[float, str], "InstructionCost"]]


class NkiCostFormulaError(LookupError):
    """An instruction reached the cost model with no declared formula for its engine."""


@dataclass(frozen=True)
class InstructionSpec:
    """Everything the simulator and the cost model know about one instruction."""

    name: str
    costs: Mapping[str, CostFormula]  # engine short name ("vector", "dma"...) -> formula
    semantics: Callable[..., Any] | None = None  # the dst-first function that simulates it
    legacy: Callable[..., Any] | None = None  # the legacy result-returning form, if NKI had one
    min_version: int = 2  # NeuronCore version it needs (2 = every target)
    simulated: bool = True  # False: refused with a clear error (declared so it is costed if recorded)
    notes: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def engines(self) -> tuple[str, ...]:
        return tuple(self.costs)


_SPECS: dict[str, InstructionSpec] = {}
_LOADED = False


def register(spec: InstructionSpec) -> InstructionSpec:
    """Add ``spec``; a second declaration of one name, or one without a formula, is a bug."""
    if not spec.costs:
        raise NkiCostFormulaError(f"instruction {spec.name!r} is declared without a cost formula; give it one "
                                  "formula per engine it runs on (costs={engine: formula})")
    for engine, formula in spec.costs.items():
        if not callable(formula):
            raise NkiCostFormulaError(f"instruction {spec.name!r}: the cost formula for engine {engine!r} is "
                                      f"{formula!r}, not a callable")
    previous = _SPECS.get(spec.name)
    if previous is not None and previous.semantics is not spec.semantics:
        raise ValueError(f"instruction {spec.name!r} is declared twice")
    _SPECS[spec.name] = spec
    return spec


def _load() -> None:
    """Import the instruction set once (its declarations fill the table)."""
    global _LOADED
    if not _LOADED:
        _LOADED = True
        importlib.import_module("torchneuron.nki.isa")


def spec(name: str) -> InstructionSpec:
    """The declaration of instruction ``name`` (KeyError naming the known ones if none)."""
    found = _SPECS.get(name)
    if found is None:
        _load()
        found = _SPECS.get(name)
    if found is None:
        raise KeyError(f"no nki.isa instruction named {name!r} is declared")
    return found


def specs() -> Mapping[str, InstructionSpec]:
    """Every declared instruction, by name (read-only)."""
    _load()
    return MappingProxyType(_SPECS)


def cost_formula(opcode: str, engine: str) -> CostFormula:
    """The formula that costs ``opcode`` on ``engine``; :class:`NkiCostFormulaError` if none is declared."""
    try:
        declared = spec(opcode)
    except KeyError:
        raise NkiCostFormulaError(
            f"instruction {opcode!r} (on {engine}) has no declaration, so the cost model has no formula for it; "
            "declare it with torchneuron.nki.isa.core.instruction(name, costs={engine: formula})") from None
    formula = declared.costs.get(engine)
    if formula is None:
        raise NkiCostFormulaError(
            f"instruction {opcode!r} was recorded on engine {engine!r}, but its declaration gives cost formulas "
            f"only for {', '.join(declared.costs)}; add costs={{{engine!r}: formula}} to its declaration")
    return formula
