"""The instruction registry (torchneuron/nki/registry.py): every nki.isa instruction is declared
once with its semantics, legacy form, legality and one cost formula per engine; a recorded
instruction without a formula is an error, never a silent rule of thumb."""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
from torchneuron.nki import registry
from torchneuron.nki.cost import instruction_cost
from torchneuron.nki.instruction import Engine, Instruction, Operand

# nisa names that are queries of the target, not instructions: nothing to cost.
QUERIES = {"get_nc_version", "get_nc_sub_version"}


def _public_instruction_names() -> list[str]:
    names = []
    for name in nisa.__all__:
        obj = getattr(nisa, name)
        if inspect.isfunction(obj) and name not in QUERIES:
            names.append(name)
    return names


def _operand(alloc: int, shape: tuple[int, int], buffer: str = "sbuf") -> Operand:
    free = shape[1]
    return Operand(buffer=buffer, allocation=alloc, dtype="float32", shape=shape, start_partition=0,
                   partitions=shape[0], free_elements=free, itemsize=4, inner_stride_bytes=4,
                   extent=(0, shape[0] * free * 4), row_bytes=free * 4)


@pytest.mark.parametrize("name", _public_instruction_names())
def test_every_public_isa_instruction_is_declared_with_a_cost_formula(name):
    spec = registry.spec(name)
    assert spec.name == name and spec.costs, name
    assert getattr(nisa, name).spec is spec  # the public function carries its one declaration
    for engine, formula in spec.costs.items():
        assert engine in (Engine.TENSOR, Engine.VECTOR, Engine.SCALAR, Engine.GPSIMD, Engine.DMA, Engine.SYNC)
        assert registry.cost_formula(name, engine) is formula
        # every declared formula costs a plausible record on its engine
        buf = "shared_hbm" if engine == Engine.DMA else "sbuf"
        ins = Instruction(0, name, engine, (_operand(1, (128, 512), buf),), (_operand(2, (128, 512)),), {})
        cost = instruction_cost(ins, "trn3")
        assert math.isfinite(cost.ns) and cost.ns >= 0 and cost.formula, (name, engine)


def test_legacy_forms_are_declared_with_their_instruction():
    assert registry.spec("tensor_tensor").legacy is nisa.tensor_tensor.legacy
    assert registry.spec("nc_matmul").legacy is nisa.nc_matmul.legacy
    assert registry.spec("dma_compute").legacy is None  # no legacy form in NKI


def test_instruction_without_a_declaration_is_an_error_not_a_rule_of_thumb():
    ins = Instruction(0, "made_up_op", Engine.VECTOR, (_operand(1, (128, 64)),), (_operand(2, (128, 64)),), {})
    with pytest.raises(registry.NkiCostFormulaError, match="'made_up_op'.*no declaration"):
        instruction_cost(ins, "trn2")


def test_instruction_on_an_undeclared_engine_is_an_error():
    ins = Instruction(0, "reciprocal", Engine.GPSIMD, (_operand(1, (128, 64)),), (_operand(2, (128, 64)),), {})
    with pytest.raises(registry.NkiCostFormulaError, match="'reciprocal' was recorded on engine 'gpsimd'.*vector"):
        instruction_cost(ins, "trn2")


def test_declaring_an_instruction_without_a_formula_is_refused():
    with pytest.raises(registry.NkiCostFormulaError, match="without a cost formula"):
        registry.register(registry.InstructionSpec(name="no_formula", costs={}))
    with pytest.raises(registry.NkiCostFormulaError, match="not a callable"):
        registry.register(registry.InstructionSpec(name="bad_formula", costs={Engine.VECTOR: 3}))
    assert "no_formula" not in registry.specs() and "bad_formula" not in registry.specs()


@pytest.mark.parametrize("name, needed, target", [("exponential", 4, "trn2"), ("rand2", 4, "trn2"),
                                                   ("activate2", 4, "trn2"), ("range_select", 3, "trn1"),
                                                   ("nonzero_with_count", 3, "trn1")])
def test_legality_hook_refuses_old_targets_before_reading_arguments(name, needed, target):
    assert registry.spec(name).min_version == needed

    @nki.jit
    def kernel(a):
        getattr(nisa, name)(None, None, None)  # arguments never inspected: the target is refused first
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.load(a))
        return out

    with pytest.raises(nki.NkiValidationError, match=f"{name} .*NeuronCore-v{needed}.*target {target}"):
        nki.simulate(kernel, target=target)(np.zeros((4, 4), np.float32))
