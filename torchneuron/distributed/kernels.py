"""c10d's collective ops for neuron tensors: gloo over the tensors' host memory.

Every c10d op (``torch.ops.c10d.allreduce_`` and the rest: what ``dist.all_reduce``,
DDP's reducer, FSDP and functional collectives all end in) gets a PrivateUse1 kernel
that swaps each neuron tensor for a CPU tensor over the same memory (no copy) and
calls the op's CPU kernel on the group's gloo transport (:mod:`host_group`). gloo
reads and writes device memory directly; an asynchronous call returns gloo's ``Work``
wrapped so that ``wait()`` explains failures (:mod:`work`); every call is numbered
(:mod:`progress`), recorded in the flight recorder (:mod:`flight_recorder`) and charged
on the device's collective stream (:mod:`charging`, :mod:`comm_stream`).

Overriding c10d's PrivateUse1 kernels (registered by torch for out-of-tree backends
that subclass ``c10d::Backend`` in C++) with ``torch.library`` is the only public
hook for a Python backend; checked on torch 2.13.0.
"""

from __future__ import annotations

import datetime
import re
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as _c10d  # AllgatherOptions: not re-exported (torch 2.13.0)

from torchneuron.device import dataless
from torchneuron.device._core import cpu_view_borrowed, meta_alias
from torchneuron.distributed import comm_stream, flight_recorder, forms, reduce_ops
from torchneuron.distributed import work as work_handles
from torchneuron.distributed.charging import Charged, charge_async
from torchneuron.distributed.host_group import host_group
from torchneuron.distributed.host_views import hold, release_finished
from torchneuron.distributed.progress import DETAIL_MISMATCH, GroupProgress, progress_of

_library: torch.library.Library | None = None
_T = TypeVar("_T")
# In the text of every error gloo's TCP transport raises (its source path), e.g. a peer's
# connection closed (torch 2.13.0).
_GLOO_TRANSPORT = "gloo/transport/"
# How gloo's argument checks start their text: the method's name (torch 2.13.0).
_GLOO_PREFIX = re.compile(r"^(\[[^\]]*\]\s*)*ProcessGroupGloo::\w+:\s*")
# What the errors of a collective that ran and failed say (gloo's timeouts, its transport's
# errors, a closed or reset peer, torch's DETAIL check); any other error gloo raises refuses
# the call's arguments, alike on every rank and before any data moved ("Cannot use
# ReduceOp.BAND with non-integral dtype", "Invalid scalar type", torch 2.13.0).
_RAN_AND_FAILED = ("timed out", "timeout", "connection", "peer", "socket", "abort", _GLOO_TRANSPORT,
                   DETAIL_MISMATCH.lower())


def _refused(error: BaseException) -> bool:
    """Whether gloo refused a collective's arguments rather than timing out or losing a peer."""
    lowered = str(error).lower()
    return not any(words in lowered for words in _RAN_AND_FAILED)


def _shapes(shapes: list[list[int]]) -> str:
    """``[4]``; ``2 x [4]`` for a list of equal shapes; ``[4], [2]`` otherwise."""
    if not shapes:
        return "[]"
    if len(shapes) == 1:
        return str(shapes[0])
    if all(shape == shapes[0] for shape in shapes):
        return f"{len(shapes)} x {shapes[0]}"
    text = ", ".join(str(shape) for shape in shapes)
    return text if len(text) <= 120 else text[:117] + "..."


# Whether this process is a rank of a simulated job (read once, when the kernels install).
_SIMULATED = False


def install() -> None:
    """Registers the kernels once per process (when the first neuron group is created)."""
    global _library, _SIMULATED
    if _library is not None:
        return
    from torchneuron.distributed.backend import simulated_world

    _SIMULATED = simulated_world()
    library = torch.library.Library("c10d", "IMPL")
    with warnings.catch_warnings():
        # torch warns that the kernels it registered for PrivateUse1 are overridden: intended.
        warnings.simplefilter("ignore")
        for name, kernel in _KERNELS.items():
            library.impl(name, kernel, "PrivateUse1")
    _library = library


class _Call:
    """One collective call: host views of its neuron tensors, the device they are on, and
    what it needs to report its outcome (sequence number, flight-recorder entry, stream end)."""

    def __init__(self, op: str) -> None:
        release_finished()  # the views of earlier calls that gloo is done with
        work_handles.sweep()  # handles whose futures gloo finished
        comm_stream.join_deferred()  # collectives whose future was taken earlier on this thread
        self.op = op
        self.device: torch.device | None = None
        self.nbytes = 0
        self.progress: GroupProgress | None = None
        self.seq = 0
        self.inputs: list[list[int]] = []
        self.outputs: list[list[int]] = []
        self.dtypes: list[str] = []
        self.charged: Charged | None = None
        self.entry: flight_recorder.Entry | None = None
        self.pairs: list[tuple[torch.Tensor, torch.Tensor]] = []  # (gloo's view, the neuron tensor)
        self.side: str | None = None  # "send" or "recv" for a numbered point-to-point op
        self.peer = -1
        self.tag = 0
        self.agreed: str | None = None  # what the ranks compare, when not the inputs and outputs

    def host(self, tensor: torch.Tensor, count: bool = True, role: str = "in") -> torch.Tensor:
        """A CPU view of ``tensor`` for gloo; ``role``: "in", "out" or "inout"."""
        if tensor.device.type != "neuron":
            raise ValueError(
                f"{self.op}: the neuron backend carries neuron tensors, got a tensor on "
                f"{tensor.device}; move it with .to('neuron'), or create the group with "
                f"backend='cpu:gloo,neuron:neuron' and keep each call's tensors on one device")
        if self.device is None:
            self.device = tensor.device
        elif tensor.device != self.device:
            raise ValueError(f"{self.op}: all tensors of one collective must be on one neuron "
                             f"device, got {self.device} and {tensor.device}")
        if count:
            self.nbytes += tensor.numel() * tensor.element_size()
        if role in ("in", "inout"):
            self.inputs.append(list(tensor.shape))
        if role in ("out", "inout"):
            self.outputs.append(list(tensor.shape))
        dtype = str(tensor.dtype).removeprefix("torch.")
        if dtype not in self.dtypes:
            self.dtypes.append(dtype)
        if role != "in" and dataless.STATE.on:
            dataless.STATE.written(tensor)  # gloo moves the bytes, which mean nothing
        if _SIMULATED:  # a simulated job's fake backend: shapes, no bytes
            return meta_alias(tensor)
        # gloo gets a view that does not keep the device memory alive: the caller holds a
        # synchronous call's tensors, an asynchronous call's handle holds them (as NCCL's work
        # holds its outputs) and maps gloo's results back to them (work.NeuronWork). So the
        # memory is freed when the program frees it, as on the device (a view that owned it
        # kept it allocated until the next collective call: peaks above the real ones).
        view = cpu_view_borrowed(tensor)
        self.pairs.append((view, tensor))
        hold(view)  # so that gloo's threads never free its Python object (see host_views)
        return view

    def hosts(self, tensors: list[torch.Tensor], count: bool = True, role: str = "in") -> list[torch.Tensor]:
        return [self.host(t, count, role) for t in tensors]

    def flat(self, view: torch.Tensor) -> torch.Tensor:
        """gloo's view ``view`` seen flat (a form gloo lacks, :mod:`forms`), kept as gloo's views are."""
        flat = view.view(-1)
        if not _SIMULATED:
            tensor = next(t for v, t in self.pairs if v is view)
            self.pairs.append((flat, tensor))
            hold(flat)
        return flat

    def staged(self, buffer: torch.Tensor) -> torch.Tensor:
        """A host buffer of the call's own that gloo reads or writes (uneven forms staged for
        gloo's split all_to_all, PREMUL_SUM's scaled inputs), freed as gloo's views are."""
        if not _SIMULATED:
            hold(buffer)
        return buffer

    def complete(self, work: Any) -> None:
        """Waits for gloo now (a call whose results are copied out of a staging buffer);
        a failure is explained as a synchronous call's. Its handle is still returned by
        :meth:`settle`, already finished."""
        try:
            dist.Work.unbox(work).wait()
        except RuntimeError as error:
            work_handles.keep_until_exit(self.pairs)
            raise self.failed(error) from error

    def what(self) -> str:
        """What a point-to-point op carries, as both sides publish it: shape and dtype."""
        return f"{self.inputs[0] if self.inputs else []} {self.dtypes[0] if self.dtypes else '?'}"

    def signature(self) -> str:
        """What a collective carries, as every rank publishes it: ``[4] float32``, or
        ``[2] -> [4] float32`` when its outputs differ from its inputs."""
        dtypes = "/".join(self.dtypes) or "?"
        if self.agreed is not None:
            return f"{self.agreed} {dtypes}"
        if not self.outputs or self.outputs == self.inputs:
            return f"{_shapes(self.inputs)} {dtypes}"
        return f"{_shapes(self.inputs)} -> {_shapes(self.outputs)} {dtypes}"

    def issue(self, group: dist.ProcessGroup, run: Callable[[], _T], numbered: bool = True) -> _T:
        """Numbers the collective, publishes its op, shapes and dtypes to the group (one store
        write, before gloo sees it: a rank that fails then finds every record made before), and
        runs ``run`` (the gloo call). ``numbered=False``: a send or receive, numbered already.

        Errors gloo raises at once are explained as a failed wait's are when they say the ranks
        disagree (``TORCH_DISTRIBUTED_DEBUG=DETAIL``'s check, torch's ``ProcessGroupWrapper``)
        or come from gloo's transport (a peer's connection already closed); gloo's refusals of
        the arguments are named as the neuron backend's (:meth:`cannot_run`).
        """
        if numbered:
            self.progress = progress_of(group)
            if self.progress is not None:
                signature = self.signature()
                self.seq = self.progress.arrive(self.op, signature)
                mismatch = self.progress.agree(self.op, signature)
                if mismatch is not None:
                    raise self.refused(group, mismatch)
        try:
            return run()
        except RuntimeError as error:
            if DETAIL_MISMATCH in str(error) or _GLOO_TRANSPORT in str(error):
                raise self.failed(error) from error
            if _refused(error):
                raise self.cannot_run(error) from error
            raise

    def refused(self, group: dist.ProcessGroup, error: dist.DistBackendError) -> dist.DistBackendError:
        """A collective refused before it reached gloo: recorded as failed, the recorder dumped."""
        self.entry = flight_recorder.record(dict(
            group=group.group_name, seq=self.seq, op=self.op, peer=None, input_shapes=self.inputs,
            output_shapes=self.outputs, dtypes=self.dtypes, nbytes=self.nbytes, async_op=False,
            modeled_start=None, modeled_seconds=None), rank=dist.get_rank() if dist.is_initialized() else 0)
        flight_recorder.finish(self.entry, error)
        dumped = flight_recorder.dump_on_failure()
        return dist.DistBackendError(f"{error}; this rank's flight recorder: {dumped}") if dumped else error

    def number_p2p(self, group: dist.ProcessGroup, side: str, peer: int, tag: int) -> None:
        """Numbers a send or receive and publishes it, before it is handed to gloo: a receive
        that completes then always finds its send's record."""
        self.progress = progress_of(group)
        if self.progress is not None:
            self.side, self.peer, self.tag = side, peer, tag
            self.seq = self.progress.number_p2p(side, peer, tag, self.what())

    def charge(self, kind: str, group: dist.ProcessGroup, peer: int | None = None,
               async_op: bool = True) -> None:
        """Records the issued op: its modelled time on the collective stream and its
        flight-recorder entry (under the number :meth:`issue` or :meth:`number_p2p` gave it)."""
        if self.device is not None:
            self.charged = charge_async(kind, self.nbytes, group, self.device, peer=peer)
        if self.progress is None:
            self.progress = progress_of(group)
        ranks = self.progress.global_ranks if self.progress is not None else None
        rank = dist.get_rank() if dist.is_initialized() else 0
        self.entry = flight_recorder.record(dict(
            group=group.group_name, seq=self.seq, op=self.op,
            peer=ranks[peer] if ranks is not None and peer is not None and 0 <= peer < len(ranks) else peer,
            input_shapes=self.inputs, output_shapes=self.outputs, dtypes=self.dtypes,
            nbytes=self.nbytes, async_op=async_op,
            modeled_start=self.charged.modeled_start if self.charged else None,
            modeled_seconds=self.charged.cost.seconds if self.charged else None,
        ), rank=rank)

    # ---- outcome (called by settle, or by the async handle's wait) ----------------

    def failed(self, error: BaseException) -> dist.DistBackendError:
        """The explained error for gloo's ``error``; the entry is marked failed and dumped."""
        if _refused(error):
            explained = self.cannot_run(error)
        elif self.progress is None:
            explained = dist.DistBackendError(f"{self.op} failed: {str(error).strip()}")
        elif self.side is not None:
            explained = self.progress.p2p_failure(self.side, self.seq, self.peer, self.tag,
                                                  self.what(), error)
        else:
            explained = self.progress.failure(self.op, self.seq, error, self.signature())
        if self.entry is not None:
            flight_recorder.finish(self.entry, explained)
        dumped = flight_recorder.dump_on_failure()
        if dumped is not None:
            explained = dist.DistBackendError(f"{explained}; this rank's flight recorder: {dumped}")
        return explained

    def cannot_run(self, error: BaseException) -> dist.DistBackendError:
        """A collective gloo refused for its arguments (every rank refuses it alike, at once):
        named as the neuron backend's refusal, not as a timeout."""
        where = f"collective #{self.seq} on process group {self.progress.name!r}, " if self.progress else ""
        rank = dist.get_rank() if dist.is_initialized() else 0
        reason = _GLOO_PREFIX.sub("", str(error).strip()).replace(" with Gloo", "")
        return dist.DistBackendError(f"{self.op} ({where}rank {rank}, {self.signature()}): the neuron backend "
                                     f"cannot run it: {reason}")

    def succeeded(self) -> dist.DistBackendError | None:
        """Marks the entry completed and joins the collective into the current stream; for a
        receive whose matching send carried another shape or dtype, returns that error."""
        if self.side == "recv" and self.progress is not None:
            mismatch = self.progress.p2p_mismatch("recv", self.seq, self.peer, self.tag, self.what())
            if mismatch is not None:
                if self.entry is not None:
                    flight_recorder.finish(self.entry, mismatch)
                flight_recorder.dump_on_failure()
                return mismatch
        if self.entry is not None:
            flight_recorder.finish(self.entry)
        self.join_stream()
        return None

    def join_stream(self) -> None:
        """The calling thread's current stream waits for the collective's end (modelled)."""
        if self.charged is not None:
            comm_stream.join(self.charged.device, self.charged.end)

    def settle(self, work: Any, async_op: bool) -> Any:
        """A synchronous call waits here, so that a failure names the missing ranks; an
        asynchronous one returns a handle whose ``wait()`` does (:mod:`work`).

        (c10d's Python wrapper waits on the returned work next; it is then already done.)
        """
        if work is None:
            return work
        if async_op:
            return work_handles.NeuronWork(work, self).boxed()
        try:
            dist.Work.unbox(work).wait()  # the Work binding releases the GIL (the watchdog runs)
        except RuntimeError as error:
            work_handles.keep_until_exit(self.pairs)  # gloo may still write the tensors
            raise self.failed(error) from error
        mismatch = self.succeeded()
        if mismatch is not None:
            raise mismatch
        return work


def _group(boxed: Any) -> tuple[dist.ProcessGroup, Any]:
    """The user's ProcessGroup and its gloo transport (boxed) from c10d's boxed group."""
    group = dist.ProcessGroup.unbox(boxed)
    return group, host_group(group).boxed()


def _transport(boxed: Any) -> tuple[dist.ProcessGroup, dist.ProcessGroup]:
    """The user's ProcessGroup and its gloo transport, as Python ``ProcessGroup`` objects.

    The hot collectives call the transport's own methods (``ProcessGroup.allreduce`` and
    the like: c10d's C++ calls the same CPU kernel through the dispatcher, about 10 us);
    calling the op again through ``torch.ops.c10d`` from Python cost about 30 us more
    (torch 2.13.0's ``OpOverload.__call__`` checks). Their work comes back unboxed.
    """
    group = dist.ProcessGroup.unbox(boxed)
    return group, host_group(group).transport


def _op(name: str) -> Callable[..., Any]:
    return getattr(torch.ops.c10d, name).default


def _options(options: Any, async_op: bool, timeout: int, reduce_op: dist.ReduceOp | None = None) -> Any:
    """c10d's options struct as its CPU kernels fill it from the op's arguments."""
    options.asyncOp = async_op
    if timeout != -1:  # -1: the group's timeout (c10d's kUnsetTimeout)
        options.timeout = datetime.timedelta(milliseconds=timeout)
    if reduce_op is not None:
        options.reduceOp = reduce_op
    return options


# The reducing collectives run their ReduceOp on gloo, except PREMUL_SUM (reduce_ops): its
# inputs are scaled first (in place where the collective overwrites them, else a scaled
# copy gloo reads) and gloo sums. They call the transport's own methods with SUM then.

def allreduce_(tensors, process_group, reduce_op, sparse_indices, async_op=True, timeout=-1):
    call, (group, transport) = _Call("all_reduce"), _transport(process_group)
    op, factor = reduce_ops.resolve(call.op, reduce_op)
    views = call.hosts(tensors, role="inout")
    if sparse_indices is None:
        options = _options(dist.AllreduceOptions(), async_op, timeout, op)

        def run() -> Any:
            if factor is not None:
                for view in views:
                    reduce_ops.scale_(view, factor)
            return transport.allreduce(views, options).boxed()

        work = call.issue(group, run)
    elif factor is not None:
        raise ValueError("all_reduce: the neuron backend cannot run ReduceOp.PREMUL_SUM on sparse tensors; "
                         "scale them first and use ReduceOp.SUM")
    else:
        host = transport.boxed()
        _, work = call.issue(group, lambda: _op("allreduce_")(views, host, reduce_op, sparse_indices,
                                                              async_op, timeout))
    call.charge("all_reduce", group, async_op=async_op)
    return tensors, call.settle(work, async_op)


def allreduce_coalesced_(tensors, process_group, reduce_op, async_op=True, timeout=-1):
    call, (group, transport) = _Call("all_reduce_coalesced"), _transport(process_group)
    op, factor = reduce_ops.resolve(call.op, reduce_op)
    forms.one_dtype(call.op, tensors)
    views = call.hosts(tensors, role="inout")
    if factor is None:
        host = transport.boxed()
        work = call.issue(group, lambda: _op("allreduce_coalesced_")(views, host, reduce_op, async_op, timeout))
    else:
        options = _options(dist.AllreduceCoalescedOptions(), async_op, timeout, op)

        def run() -> Any:
            for view in views:
                reduce_ops.scale_(view, factor)
            return transport.allreduce_coalesced(views, options).boxed()

        work = call.issue(group, run)
    call.charge("all_reduce", group, async_op=async_op)
    return call.settle(work, async_op)


def broadcast_(tensors, process_group, root_rank, root_tensor, async_op=True, timeout=-1):
    call, (group, host) = _Call("broadcast"), _group(process_group)
    views = call.hosts(tensors, role="inout")
    _, work = call.issue(group, lambda: _op("broadcast_")(views, host, root_rank, root_tensor,
                                                          async_op, timeout))
    call.charge("broadcast", group, async_op=async_op)
    return tensors, call.settle(work, async_op)


def reduce_(tensors, process_group, reduce_op, root_rank, root_tensor, async_op=True, timeout=-1):
    call, (group, transport) = _Call("reduce"), _transport(process_group)
    op, factor = reduce_ops.resolve(call.op, reduce_op)
    views = call.hosts(tensors, role="inout")
    if factor is None:
        host = transport.boxed()
        work = call.issue(group, lambda: _op("reduce_")(views, host, reduce_op, root_rank, root_tensor,
                                                        async_op, timeout))
        call.charge("reduce", group, async_op=async_op)
        return call.settle(work, async_op)
    # Scaled copies: NCCL leaves the tensors of the ranks other than the root as they were.
    staged = [call.staged(reduce_ops.scaled(view, factor)) for view in views]
    options = _options(dist.ReduceOptions(), async_op, timeout, op)
    options.rootRank, options.rootTensor = root_rank, root_tensor
    work = call.issue(group, lambda: transport.reduce(staged, options).boxed())
    call.charge("reduce", group, async_op=async_op)
    call.complete(work)
    if group.rank() == root_rank:
        views[root_tensor].copy_(staged[root_tensor])
    return call.settle(work, async_op)


def allgather_(output_tensors, input_tensors, process_group, async_op=True, timeout=-1):
    call, (group, host) = _Call("all_gather"), _group(process_group)
    uneven = len(input_tensors) == 1 and len(output_tensors) == 1 and forms.uneven_gather(
        call.op, output_tensors[0], input_tensors[0], group.size(), group.rank())
    outputs = [call.hosts(out, role="out") for out in output_tensors]
    inputs = call.hosts(input_tensors, count=False)
    if not uneven:
        _, work = call.issue(group, lambda: _op("allgather_")(outputs, inputs, host, async_op, timeout))
        call.charge("all_gather", group, async_op=async_op)
        return output_tensors, call.settle(work, async_op)
    # Uneven outputs (documented for all_gather; gloo wants equal ones): gloo's split all_to_all
    # sends this rank's input to every rank. The ranks agree on the output list, which every
    # rank passes alike (their inputs differ).
    call.agreed = f"-> {_shapes(call.outputs)}"
    work, received = _split_all_to_all(call, group, host, [inputs[0]] * group.size(), outputs[0],
                                       async_op, timeout, "all_gather")
    return output_tensors, received(work)


def _split_all_to_all(call: _Call, group: dist.ProcessGroup, host: Any, sends: list[torch.Tensor],
                      receives: list[torch.Tensor], async_op: bool, timeout: int,
                      kind: str) -> tuple[Any, Callable[[Any], Any]]:
    """``sends[r]`` to rank ``r``, ``receives[r]`` from it, of any sizes: one gloo
    ``all_to_all_single`` over staged flat buffers, charged as ``kind``; returns its work and
    the function that finishes the call (copies the received values out, settles it)."""
    send = call.staged(torch.cat([t.reshape(-1) for t in sends]))
    receive = call.staged(torch.empty(sum(t.numel() for t in receives), dtype=receives[0].dtype,
                                      device=send.device))
    out_splits, in_splits = [t.numel() for t in receives], [t.numel() for t in sends]
    work = call.issue(group, lambda: _op("alltoall_base_")(receive, send, host, out_splits, in_splits,
                                                           async_op, timeout))
    call.charge(kind, group, async_op=async_op)

    def received(work: Any) -> Any:
        call.complete(work)
        for target, part in zip(receives, receive.split(out_splits)):
            target.copy_(part.view(target.shape))
        return call.settle(work, async_op)

    return work, received


def _allgather_base_(output_tensor, input_tensor, process_group, async_op=True, timeout=-1):
    call, (group, transport) = _Call("all_gather_into_tensor"), _transport(process_group)
    flat = forms.gathered_flat(call.op, output_tensor, input_tensor, group.size())
    output, inp = call.host(output_tensor, role="out"), call.host(input_tensor, count=False)
    if flat:  # the stacked (or any other) form: the same bytes as gloo's concatenation
        output, inp = call.flat(output), call.flat(inp)
    options = _options(_c10d.AllgatherOptions(), async_op, timeout)
    work = call.issue(group, lambda: transport._allgather_base(output, inp, options).boxed())
    call.charge("all_gather", group, async_op=async_op)
    return output_tensor, call.settle(work, async_op)


def allgather_coalesced_(output_lists, input_list, process_group, async_op=True):
    call, (group, host) = _Call("all_gather_coalesced"), _group(process_group)
    outputs = [call.hosts(out, role="out") for out in output_lists]
    inputs = call.hosts(input_list, count=False)
    work = call.issue(group, lambda: _op("allgather_coalesced_")(outputs, inputs, host, async_op))
    call.charge("all_gather", group, async_op=async_op)
    return call.settle(work, async_op)


def allgather_into_tensor_coalesced_(outputs, inputs, process_group, async_op=True):
    call, (group, host) = _Call("all_gather_into_tensor_coalesced"), _group(process_group)
    flat = [forms.gathered_flat(call.op, o, i, group.size()) for o, i in zip(outputs, inputs)]
    out_views, in_views = call.hosts(outputs, role="out"), call.hosts(inputs, count=False)
    out_views = [call.flat(v) if f else v for v, f in zip(out_views, flat)]
    in_views = [call.flat(v) if f else v for v, f in zip(in_views, flat)]
    work = call.issue(group, lambda: _op("allgather_into_tensor_coalesced_")(out_views, in_views, host,
                                                                             async_op))
    call.charge("all_gather", group, async_op=async_op)
    return call.settle(work, async_op)


def reduce_scatter_(output_tensors, input_tensors, process_group, reduce_op, async_op=True, timeout=-1):
    call, (group, transport) = _Call("reduce_scatter"), _transport(process_group)
    op, factor = reduce_ops.resolve(call.op, reduce_op)
    inputs = [call.hosts(inp) for inp in input_tensors]
    outputs = call.hosts(output_tensors, count=False, role="out")
    # Every rank passes the same input list; outputs differ when it is uneven (NCCL and gloo
    # run that), so the ranks agree on the inputs.
    call.agreed = _shapes(call.inputs)
    if factor is None:
        host = transport.boxed()
        _, work = call.issue(group, lambda: _op("reduce_scatter_")(outputs, inputs, host, reduce_op,
                                                                   async_op, timeout))
    else:
        staged = [[call.staged(reduce_ops.scaled(v, factor)) for v in inp] for inp in inputs]
        options = _options(dist.ReduceScatterOptions(), async_op, timeout, op)
        work = call.issue(group, lambda: transport.reduce_scatter(outputs, staged, options).boxed())
    call.charge("reduce_scatter", group, async_op=async_op)
    return output_tensors, call.settle(work, async_op)


def _reduce_scatter_base_(output_tensor, input_tensor, process_group, reduce_op, async_op=True, timeout=-1):
    call, (group, transport) = _Call("reduce_scatter_tensor"), _transport(process_group)
    op, factor = reduce_ops.resolve(call.op, reduce_op)
    flat = forms.scattered_flat(call.op, output_tensor, input_tensor, group.size())
    output, inp = call.host(output_tensor, count=False, role="out"), call.host(input_tensor)
    if factor is not None:
        inp = call.staged(reduce_ops.scaled(inp, factor))
        if flat:
            inp = inp.view(-1)
    elif flat:
        inp = call.flat(inp)
    if flat:  # the stacked (or any other) form: the same bytes as gloo's concatenation
        output = call.flat(output)
    options = _options(dist.ReduceScatterOptions(), async_op, timeout, op)
    work = call.issue(group, lambda: transport._reduce_scatter_base(output, inp, options).boxed())
    call.charge("reduce_scatter", group, async_op=async_op)
    return output_tensor, call.settle(work, async_op)


def reduce_scatter_tensor_coalesced_(outputs, inputs, process_group, reduce_op, async_op=True, timeout=-1):
    call, (group, transport) = _Call("reduce_scatter_tensor_coalesced"), _transport(process_group)
    op, factor = reduce_ops.resolve(call.op, reduce_op)
    flat = [forms.scattered_flat(call.op, o, i, group.size()) for o, i in zip(outputs, inputs)]
    out_views, in_views = call.hosts(outputs, count=False, role="out"), call.hosts(inputs)
    if factor is not None:
        in_views = [call.staged(reduce_ops.scaled(v, factor)) for v in in_views]
        in_views = [v.view(-1) if f else v for v, f in zip(in_views, flat)]
    else:
        in_views = [call.flat(v) if f else v for v, f in zip(in_views, flat)]
    out_views = [call.flat(v) if f else v for v, f in zip(out_views, flat)]
    options = _options(dist.ReduceScatterOptions(), async_op, timeout, op)
    work = call.issue(group, lambda: transport.reduce_scatter_tensor_coalesced(out_views, in_views,
                                                                               options).boxed())
    call.charge("reduce_scatter", group, async_op=async_op)
    return call.settle(work, async_op)


def alltoall_(output_tensors, input_tensors, process_group, async_op=True, timeout=-1):
    call, (group, host) = _Call("all_to_all"), _group(process_group)
    uneven = forms.uneven_all_to_all(call.op, output_tensors, input_tensors, group.size())
    outputs, inputs = call.hosts(output_tensors, count=False, role="out"), call.hosts(input_tensors)
    if not uneven:
        _, work = call.issue(group, lambda: _op("alltoall_")(outputs, inputs, host, async_op, timeout))
        call.charge("all_to_all", group, async_op=async_op)
        return output_tensors, call.settle(work, async_op)
    # Uneven tensors (the documented example; gloo wants one size): gloo's split all_to_all.
    work, received = _split_all_to_all(call, group, host, inputs, outputs, async_op, timeout, "all_to_all")
    return output_tensors, received(work)


def alltoall_base_(output, input, process_group, output_split_sizes, input_split_sizes,
                   async_op=True, timeout=-1):
    call, (group, host) = _Call("all_to_all_single"), _group(process_group)
    out_view, in_view = call.host(output, count=False, role="out"), call.host(input)
    work = call.issue(group, lambda: _op("alltoall_base_")(out_view, in_view, host, output_split_sizes,
                                                           input_split_sizes, async_op, timeout))
    call.charge("all_to_all", group, async_op=async_op)
    return call.settle(work, async_op)


def gather_(output_tensors, input_tensors, process_group, root_rank, async_op=True, timeout=-1):
    call, (group, host) = _Call("gather"), _group(process_group)
    inputs = call.hosts(input_tensors)
    outputs = [call.hosts(out, count=False, role="out") for out in output_tensors]
    call.nbytes *= group.size()  # nccom-test's size for gather: the gathered buffer
    work = call.issue(group, lambda: _op("gather_")(outputs, inputs, host, root_rank, async_op, timeout))
    call.charge("gather", group, async_op=async_op)
    return call.settle(work, async_op)


def scatter_(output_tensors, input_tensors, process_group, root_rank, async_op=True, timeout=-1):
    call, (group, host) = _Call("scatter"), _group(process_group)
    outputs = call.hosts(output_tensors, role="out")
    inputs = [call.hosts(inp, count=False) for inp in input_tensors]
    call.nbytes *= group.size()  # the scattered buffer
    _, work = call.issue(group, lambda: _op("scatter_")(outputs, inputs, host, root_rank, async_op, timeout))
    call.charge("scatter", group, async_op=async_op)
    return output_tensors, call.settle(work, async_op)


# send and recv have no async_op: c10d's dist.send/recv wait on the handle, isend/irecv
# return it; both get the explaining handle.
def send(tensors, process_group, dst, tag):
    call, (group, host) = _Call("send"), _group(process_group)
    views = call.hosts(tensors)
    call.number_p2p(group, "send", dst, tag)
    work = call.issue(group, lambda: _op("send")(views, host, dst, tag), numbered=False)
    call.charge("send_recv", group, peer=dst)
    return call.settle(work, async_op=True)


def recv_(tensors, process_group, src, tag):
    call, (group, host) = _Call("recv"), _group(process_group)
    views = call.hosts(tensors, role="inout")
    call.number_p2p(group, "recv", src, tag)
    work = call.issue(group, lambda: _op("recv_")(views, host, src, tag), numbered=False)
    call.charge("send_recv", group, peer=src)
    return call.settle(work, async_op=True)


def recv_any_source_(tensors, process_group, tag):
    call, (group, host) = _Call("recv"), _group(process_group)
    work = _op("recv_any_source_")(call.hosts(tensors, role="inout"), host, tag)
    call.charge("send_recv", group)
    return call.settle(work, async_op=True)


def barrier(tensor, process_group, device_ids, async_op=True, timeout=-1):
    call, (group, host) = _Call("barrier"), _group(process_group)
    view = call.host(tensor, count=False)
    work = call.issue(group, lambda: _op("barrier")(view, host, device_ids, async_op, timeout))
    call.charge("barrier", group, async_op=async_op)
    return call.settle(work, async_op)


def monitored_barrier_(tensor, process_group, device_ids, timeout, wait_all_ranks):
    call, (group, host) = _Call("monitored_barrier"), _group(process_group)
    view = call.host(tensor, count=False)
    call.issue(group, lambda: None)  # numbered before it blocks (it waits inside gloo)
    call.charge("barrier", group, async_op=False)
    try:
        _op("monitored_barrier_")(view, host, device_ids, timeout, wait_all_ranks)
    except RuntimeError as error:  # gloo's own message names the ranks; keep it, mark the entry
        if call.entry is not None:
            flight_recorder.finish(call.entry, error)
        raise
    call.succeeded()


_KERNELS: dict[str, Callable[..., Any]] = {
    fn.__name__: fn
    for fn in (
        allreduce_, allreduce_coalesced_, broadcast_, reduce_, allgather_, _allgather_base_,
        allgather_coalesced_, allgather_into_tensor_coalesced_, reduce_scatter_,
        _reduce_scatter_base_, reduce_scatter_tensor_coalesced_, alltoall_, alltoall_base_,
        gather_, scatter_, send, recv_, recv_any_source_, barrier, monitored_barrier_,
    )
}
