"""The tensor forms NCCL accepts and gloo does not, as shapes gloo takes.

Why: PyTorch documents forms of its collectives that NCCL runs and gloo refuses
(checked on torch 2.13.0), and the neuron backend carries its tensors on gloo:

- ``all_gather_into_tensor`` (and its coalesced form) into the *stacked* output
  ``[world, *input.shape]``, or any output of ``world x input.numel()`` elements: gloo wants
  the concatenation along dim 0 ("invalid tensor size at index 0");
- ``reduce_scatter_tensor`` (and its coalesced form) from a stacked input: gloo wants the
  concatenation (a failed ``CHECK``);
- ``all_gather`` into outputs of uneven sizes ("Uneven sized tensors are supported") and
  ``all_to_all`` of uneven tensors (its documented example): gloo wants equal sizes.

NCCL reads these tensors by element count alone, so the same memory seen flat is the
same collective: the first two run on gloo over flat views, the uneven lists on gloo's
``all_to_all_single`` with split sizes (:mod:`kernels`). Everything else these
functions refuse with an error worded as the neuron backend's, naming the shapes.
"""

from __future__ import annotations

import torch


def _shape(tensor: torch.Tensor) -> list[int]:
    return list(tensor.shape)


def _same_dtype(op: str, output: torch.Tensor, input: torch.Tensor) -> None:
    if output.dtype != input.dtype:
        raise TypeError(f"{op}: the neuron backend needs the output's dtype to be the input's, got output "
                        f"{_shape(output)} {output.dtype} and input {_shape(input)} {input.dtype}")


def _flat_or_refuse(op: str, output: torch.Tensor, input: torch.Tensor, form: str) -> bool:
    """True (run on flat views) when both tensors are contiguous; else raises."""
    if output.is_contiguous() and input.is_contiguous():
        return True
    raise ValueError(f"{op}: the neuron backend needs contiguous tensors in the {form} form, got output "
                     f"{_shape(output)} (contiguous: {output.is_contiguous()}) and input {_shape(input)} "
                     f"(contiguous: {input.is_contiguous()}); call .contiguous() on them first")


def _whole_flat(op: str, whole: torch.Tensor, part: torch.Tensor, world: int, whole_name: str,
                part_name: str) -> bool:
    """Whether ``whole`` (``world`` x ``part``'s elements) must be used as a flat view: any form
    but gloo's own concatenation along dim 0; raises for any other size."""
    n = part.numel()
    s = _shape(part)
    if whole.numel() != world * n:
        concat = [world * s[0], *s[1:]] if s else [world]
        raise ValueError(
            f"{op}: the neuron backend needs an {whole_name} of world_size x the {part_name}'s elements "
            f"({world} x {n} = {world * n}), e.g. {concat} (concatenated) or {[world, *s]} (stacked); "
            f"got {whole_name} {_shape(whole)} for {part_name} {s}")
    if part.dim() >= 1 and _shape(whole) == [world * part.shape[0], *part.shape[1:]]:
        return False  # gloo's form
    form = "stacked" if _shape(whole) == [world, *part.shape] else "flat"
    output, input = (whole, part) if whole_name == "output" else (part, whole)
    return _flat_or_refuse(op, output, input, form)


def gathered_flat(op: str, output: torch.Tensor, input: torch.Tensor, world: int) -> bool:
    """Whether an ``all_gather_into_tensor`` must run on flat views (any form but gloo's own
    concatenation); raises for an output that is not ``world`` x the input's elements."""
    _same_dtype(op, output, input)
    return _whole_flat(op, output, input, world, "output", "input")


def scattered_flat(op: str, output: torch.Tensor, input: torch.Tensor, world: int) -> bool:
    """Whether a ``reduce_scatter_tensor`` must run on flat views (any form but gloo's own
    concatenation); raises for an input that is not ``world`` x the output's elements."""
    _same_dtype(op, output, input)
    return _whole_flat(op, input, output, world, "input", "output")


def one_dtype(op: str, tensors: list[torch.Tensor]) -> None:
    dtypes = sorted({str(t.dtype) for t in tensors})
    if len(dtypes) > 1:
        raise TypeError(f"{op}: the neuron backend needs one dtype for all tensors of the call, got "
                        f"{', '.join(dtypes)}")


def uneven_gather(op: str, outputs: list[torch.Tensor], input: torch.Tensor, world: int, rank: int) -> bool:
    """Whether an ``all_gather`` into ``outputs`` has outputs of other shapes than the input
    (gloo's form is ``world`` outputs of the input's shape); raises when this rank's output
    cannot hold its input or the list is not one tensor per rank."""
    if all(_shape(o) == _shape(input) for o in outputs) and len(outputs) == world:
        return False
    if len(outputs) != world:
        raise ValueError(f"{op}: the neuron backend needs one output tensor per rank ({world}), got "
                         f"{len(outputs)}")
    one_dtype(op, [*outputs, input])
    if outputs[rank].numel() != input.numel():
        raise ValueError(f"{op}: the neuron backend needs this rank's output (index {rank}) to hold its "
                         f"input's {input.numel()} elements, got output {_shape(outputs[rank])} for input "
                         f"{_shape(input)}")
    return True


def uneven_all_to_all(op: str, outputs: list[torch.Tensor], inputs: list[torch.Tensor], world: int) -> bool:
    """Whether an ``all_to_all`` has tensors of more than one shape (gloo's form is one shape
    for every input and output); raises when the lists are not one tensor per rank."""
    if len(outputs) != world or len(inputs) != world:
        raise ValueError(f"{op}: the neuron backend needs one input and one output tensor per rank "
                         f"({world}), got {len(inputs)} inputs and {len(outputs)} outputs")
    first = _shape(inputs[0])
    if all(_shape(t) == first for t in (*inputs, *outputs)):
        return False
    one_dtype(op, [*outputs, *inputs])
    return True
