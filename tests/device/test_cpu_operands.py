"""CPU tensors as operands of neuron ops: accepted exactly where CUDA accepts them.

CUDA's rules (torch 2.13.0): ops marked ``device_check: NoCheck`` in
native_functions.yaml leave devices to their kernels, which take CPU scalars
(TensorIterator arithmetic, ``where``, values read with ``.item()``) and CPU indices
(``x[idx]``, ``index_put_``); every other op with a CUDA kernel is preceded by PyTorch's
generated check, which refuses any CPU tensor, 0-dim or not; and a few NoCheck kernels
check one argument themselves (``index_fill_``'s index, ``masked_fill_``'s mask).
Accepted cases are compared with CPU; refused ones must raise CUDA's error naming the
argument.
"""

import os
import subprocess
import sys

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SAME_DEVICE = "Expected all tensors to be on the same device"


def _pair(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    cpu = torch.randn(*shape, generator=g)
    return cpu, cpu.to("neuron")


def _same(neuron_t, cpu_t):
    assert neuron_t.device.type == "neuron"
    assert torch.equal(neuron_t.cpu(), cpu_t)


# ------------------------------------------------------------------ accepted, as on CUDA
ACCEPTED = {
    "x[cpu index]": lambda x: x[torch.tensor([0, 2])],
    "x[cpu 0-dim index]": lambda x: x[torch.tensor(1)],
    "x[cpu bool mask]": lambda x: x[torch.tensor([True, False, True, False, True])],
    "x[cpu index] = 1.5": lambda x: x.__setitem__(torch.tensor([0, 2]), 1.5) or x,
    "x[1, cpu 0-dim] = 7.5": lambda x: x.__setitem__((1, torch.tensor(0)), 7.5) or x,
    "index_put_ cpu indices": lambda x: x.index_put_(
        (torch.tensor([0, 2, 1]),), torch.ones(3, 3, device=x.device)),
    "index_put_ cpu indices, accumulate": lambda x: x.index_put_(
        (torch.tensor([0, 2, 0]),), torch.ones(3, 3, device=x.device), accumulate=True),
    "index_put_ cpu 0-dim value": lambda x: x.index_put_(
        (torch.tensor([0, 2]).to(x.device),), torch.tensor(4.0)),
    "index_fill_ cpu 0-dim value": lambda x: x.index_fill_(
        0, torch.tensor([1, 3]).to(x.device), torch.tensor(-2.0)),
    "masked_fill cpu 0-dim value": lambda x: x.masked_fill(x > 0, torch.tensor(9.0)),
    "where cpu 0-dim other": lambda x: torch.where(x > 0, x, torch.tensor(0.5)),
    "mul cpu 0-dim": lambda x: x * torch.tensor(2.5),
    "fill_ cpu 0-dim": lambda x: x.fill_(torch.tensor(3.0)),
    "clamp scalar bounds": lambda x: torch.clamp(x, -0.5, 0.5),
}


@pytest.mark.parametrize("case", sorted(ACCEPTED))
def test_cpu_operand_accepted_where_cuda_accepts_it(case):
    cpu, neuron = _pair(5, 3)
    expected = ACCEPTED[case](cpu.clone())
    got = ACCEPTED[case](neuron)
    _same(got, expected)


# ------------------------------------------------------------------ refused, as on CUDA
REFUSED = {
    # PyTorch's generated check in front of the CUDA kernel: no CPU tensor, 0-dim or not
    "index_select cpu index": (lambda x: x.index_select(0, torch.tensor([0, 2])), "index"),
    "index_select cpu 0-dim index": (lambda x: x.index_select(0, torch.tensor(1)), "index"),
    "clamp cpu 0-dim min": (lambda x: torch.clamp(x, min=torch.tensor(0.0)), "min"),
    "gather cpu index": (lambda x: torch.gather(x, 0, torch.zeros(2, 3, dtype=torch.long)),
                         "index"),
    "index_add_ cpu index": (lambda x: x.index_add_(0, torch.tensor([0, 1]),
                                                     torch.ones(2, 3, device=x.device)), "index"),
    "index_copy_ cpu index": (lambda x: x.index_copy_(0, torch.tensor([0, 1]),
                                                       torch.ones(2, 3, device=x.device)), "index"),
    "take cpu index": (lambda x: x.take(torch.tensor([0, 4])), "index"),
    "scatter_ cpu 0-dim src": (lambda x: x.scatter_(0, torch.zeros(1, 3, dtype=torch.long)
                                                     .to(x.device), torch.tensor(1.0)), "src"),
    "addmm cpu 0-dim self (fast kernel)": (
        lambda x: torch.addmm(torch.tensor(1.0), x, x.t()),
        "mat1 is on neuron:0, different from other tensors on cpu"),  # self came first
    "searchsorted cpu 0-dim values": (
        lambda x: torch.searchsorted(torch.arange(4.0, device=x.device), torch.tensor(1.5)),
        "self"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_cpu_operand_refused_where_cuda_refuses_it(case):
    fn, arg = REFUSED[case]
    _, neuron = _pair(5, 3)
    before = neuron.cpu()
    with pytest.raises(RuntimeError, match=SAME_DEVICE) as err:
        fn(neuron)
    msg = str(err.value)
    expected = arg if " " in arg else f"{arg} is on cpu, different from other tensors on neuron:0"
    assert f"but got {expected}" in msg
    assert "when checking argument in method aten::" in msg
    assert 'move it with .to("neuron:0") first' in msg
    assert torch.equal(neuron.cpu(), before)  # nothing was written


def test_index_fill_takes_no_cpu_index_as_cuda():
    """ATen's index_fill_ (CUDA's kernel too) iterates self and the index with a
    TensorIterator, which takes no CPU operand: a CPU index fails even when 0-dim."""
    _, neuron = _pair(5, 3)
    for index in (torch.tensor([0, 2]), torch.tensor(1)):
        for value in (1.0, torch.tensor(1.0)):
            with pytest.raises(RuntimeError, match=f"{SAME_DEVICE}, but found at least two "
                                                   "devices, neuron:0 and cpu!"):
                neuron.index_fill_(0, index, value)
            with pytest.raises(RuntimeError, match=SAME_DEVICE):
                neuron.index_fill(0, index, value)


def test_masked_fill_takes_no_cpu_mask_as_cuda():
    _, neuron = _pair(5, 3)
    for mask in (torch.ones(5, 3, dtype=torch.bool), torch.tensor(True)):
        with pytest.raises(RuntimeError, match="expected self and mask to be on the same "
                                               "device, but got mask on cpu and self on neuron:0"):
            neuron.masked_fill_(mask, 1.0)


def test_refused_under_dataless_execution_too():
    import torchneuron

    with torchneuron.dataless():
        x = torch.empty(5, 3, device="neuron")
        with pytest.raises(RuntimeError, match="but got index is on cpu"):
            x.index_select(0, torch.tensor(1))


def test_generated_op_list_matches_installed_torch():
    """The op list the check uses is derived from the installed torch's native_functions.yaml."""
    res = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "gen_cuda_device_checks.py"),
                          "--check"], capture_output=True, text=True,
                         env={**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert res.returncode == 0, res.stderr
