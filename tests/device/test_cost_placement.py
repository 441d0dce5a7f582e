"""Placement is decided once per op: the cost model takes the device layer's decision.

The C++ record asks :func:`torchneuron.device.fallback.decide` once per (op, dtypes) and
passes the answer with every op it costs; the cost model does not place the op again on
the configured chip (it did, from the inputs' and results' dtypes, and could disagree
with the record that metrics report). Another chip (``estimate``'s targets) is placed
for itself, and so is a copy within a device, which the record does not place.
"""

from __future__ import annotations

import pytest

from torchneuron.device import cost
from torchneuron.hardware import cost as hw_cost


def _tensor(dtype: str, sizes=(64, 64)) -> tuple:
    return ("tensor", list(sizes), dtype, True)


def test_the_cost_model_takes_the_records_placement_on_the_configured_chip():
    args = {"self": _tensor("float32"), "other": _tensor("float32")}
    outputs = [_tensor("float64")]  # a result dtype the record's key does not hold
    on_device = cost.op_cost("aten::add.Tensor", args, outputs, cpu_fallback=False)
    assert on_device.engine == "VectorE" and on_device.formula != hw_cost.op_cost(
        "aten::add.Tensor", [[64, 64]] * 2, ["float32"] * 2, cost.target(),
        out_shapes=[[64, 64]], out_dtypes=["float64"]).formula  # placed again: a fallback
    fallback = cost.op_cost("aten::add.Tensor", args, outputs, cpu_fallback=True)
    assert fallback.engine == "DMA"  # the record's fallback: its transfers


def test_another_chip_is_placed_by_the_cost_model_and_device_copies_by_the_record():
    args = {"self": _tensor("float32"), "other": _tensor("float32")}
    outputs = [_tensor("float64")]
    other_chip = "trn3" if cost.target().chip.name != "trn3" else "trn2"
    elsewhere = cost.op_cost("aten::add.Tensor", args, outputs, cpu_fallback=False,
                             on=cost.target(other_chip))
    assert elsewhere.engine == "DMA"  # placed for that chip: float64 runs on its host
    # A copy within a device is an op to the record (aten::_copy_from), placed once
    # there: the cost model takes its decision as for any op.
    copy_args = {"self": _tensor("float32"), "dst": _tensor("float64")}
    on_host = cost.op_cost("aten::_copy_from", copy_args, [_tensor("float64")], cpu_fallback=True)
    assert on_host.engine == "DMA"
    as_placed = cost.op_cost("aten::_copy_from", copy_args, [_tensor("float64")], cpu_fallback=False)
    assert as_placed.engine == "VectorE"  # a dtype change is a VectorE pass on the device


@pytest.mark.parametrize("on_device", [True, False])
def test_hardware_op_cost_uses_a_given_placement(on_device):
    target = hw_cost.cost_target("trn2")
    given = hw_cost.op_cost("aten::add.Tensor", [[8, 8]] * 2, ["float64"] * 2, target, on_device=on_device)
    decided = hw_cost.op_cost("aten::add.Tensor", [[8, 8]] * 2, ["float64"] * 2, target)
    assert decided.engine == "DMA"  # float64: placed on the host
    assert (given == decided) is (not on_device)
