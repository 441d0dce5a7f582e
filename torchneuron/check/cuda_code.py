"""CUDA-only code in a Python source file, each use with its accelerator-neutral replacement.

:func:`scan` parses the source with :mod:`ast` (nothing is imported or run) and
returns a :class:`Finding` per use of ``torch.cuda.*``, ``.cuda()``, a ``"cuda"``
device string, ``torch.backends.cudnn``, CUDA's amp names, the NCCL backend and
CUDA-only libraries, at its line. Where PyTorch has a device-generic spelling
(``torch.accelerator``, ``torch.amp``, ``torch.get_device_module()``,
``torch.distributed.get_default_backend_for_device``) the finding carries the
edit that writes it: a replacement of the exact source range the parser gives,
never a text search. :func:`migrate` applies a file's edits and checks the result
(it parses, it has the same lines, so every line number of the user's file still
holds); a file whose edits would not is left unchanged, its findings reported.
"""

from __future__ import annotations

import ast
import io
import tokenize
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

__all__ = ["Finding", "Migration", "migrate", "scan"]

ACCELERATOR = "torch.accelerator.current_accelerator()"
DEVICE_TYPE = f"{ACCELERATOR}.type"
BACKEND = f"torch.distributed.get_default_backend_for_device({ACCELERATOR})"

# torch.cuda.NAME -> the device-generic spelling (torch 2.13.0's torch.accelerator and
# torch.Stream/Event). Names not here go through torch.get_device_module() when the
# neuron module has them (it has torch.cuda's names: docs/device.md).
_ACCELERATOR_NAMES = {
    "is_available": "torch.accelerator.is_available",
    "device_count": "torch.accelerator.device_count",
    "current_device": "torch.accelerator.current_device_index",
    "set_device": "torch.accelerator.set_device_index",
    "synchronize": "torch.accelerator.synchronize",
    "current_stream": "torch.accelerator.current_stream",
    "set_stream": "torch.accelerator.set_stream",
    "Stream": "torch.Stream",
    "Event": "torch.Event",
    "OutOfMemoryError": "torch.OutOfMemoryError",
    **{name: f"torch.accelerator.{name}" for name in (
        "empty_cache", "memory_allocated", "max_memory_allocated", "memory_reserved",
        "max_memory_reserved", "memory_stats", "reset_peak_memory_stats",
        "reset_accumulated_memory_stats")},
}
# torch.cuda names with no neuron counterpart: reported with what to use instead.
_NO_COUNTERPART = {
    "nvtx": "use torch.profiler.record_function for named ranges",
    "graphs": "CUDA graphs have no neuron counterpart: torch.compile(backend='neuron') compiles the step",
    "CUDAGraph": "CUDA graphs have no neuron counterpart: torch.compile(backend='neuron') compiles the step",
    "graph": "CUDA graphs have no neuron counterpart: torch.compile(backend='neuron') compiles the step",
    "make_graphed_callables": "CUDA graphs have no neuron counterpart: torch.compile(backend='neuron') compiles the step",
    "jiterator": "write the kernel with NKI (nki.jit) or as PyTorch ops",
    "cudart": "CUDA's runtime has no neuron counterpart",
    "nccl": "use torch.distributed collectives (the neuron backend)",
}
_LEGACY_TENSOR_TYPES = {"FloatTensor", "DoubleTensor", "HalfTensor", "BFloat16Tensor", "LongTensor",
                        "IntTensor", "ShortTensor", "CharTensor", "ByteTensor", "BoolTensor"}
_CUDNN_NOTES = {
    "benchmark": "no effect off CUDA (neuron compiles per input shape); keep or drop it",
    "deterministic": "use torch.use_deterministic_algorithms(True), which every device honours",
    "enabled": "no effect off CUDA",
    "allow_tf32": "use torch.backends.fp32_precision / torch.set_float32_matmul_precision",
}
_BACKENDS_CUDA_NOTES = {
    "matmul": "use torch.set_float32_matmul_precision('high') (TF32 is a CUDA setting)",
    "sdp_kernel": "use torch.nn.attention.sdpa_kernel",
    "enable_flash_sdp": "use torch.nn.attention.sdpa_kernel",
    "enable_mem_efficient_sdp": "use torch.nn.attention.sdpa_kernel",
    "enable_math_sdp": "use torch.nn.attention.sdpa_kernel",
}
# Libraries that only run on CUDA GPUs, with what to use on neuron.
_CUDA_LIBRARIES = {
    "apex": "use torch.amp (autocast, GradScaler) and torch.optim's fused optimizers",
    "flash_attn": "use torch.nn.functional.scaled_dot_product_attention",
    "xformers": "use torch.nn.functional.scaled_dot_product_attention",
    "triton": "write the kernel with NKI (nki.jit), or let torch.compile(backend='neuron') fuse it",
    "bitsandbytes": "CUDA-only quantized kernels: keep the layer in bfloat16, or write it with NKI",
    "cupy": "use torch tensors on the device",
    "pycuda": "use torch tensors on the device",
    "pynvml": "use torch.accelerator's memory functions (memory_allocated, get_memory_info)",
    "nvidia": "NVIDIA's libraries need a CUDA GPU",
}


def _tokens(text: str) -> list[tokenize.TokenInfo] | None:
    """``text``'s tokens, or None where it does not tokenize on its own (a fragment the
    rewrite then leaves alone)."""
    try:
        return list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        return None


@dataclass(frozen=True)
class Edit:
    """Replace ``[start, end)`` (byte offsets into the UTF-8 source) with ``text``."""

    start: int
    end: int
    text: str


@dataclass
class Finding:
    """One CUDA-only use: where, what, and the neutral spelling (``replacement`` is empty if
    there is no automatic rewrite; ``note`` says what to do then)."""

    file: str
    line: int
    col: int
    kind: str
    code: str
    replacement: str = ""
    note: str = ""
    rewritten: bool = False
    edits: list[Edit] = field(default_factory=list, repr=False)

    def as_dict(self) -> dict[str, Any]:
        """Plain data for the JSON report (the edits are internal)."""
        out = asdict(self)
        del out["edits"]
        return out


@dataclass
class Migration:
    """A file's migrated source and its findings (``changed`` if any edit was applied)."""

    path: str
    old: str
    new: str
    findings: list[Finding]
    error: str = ""  # why the edits were not applied, if they were not

    @property
    def changed(self) -> bool:
        return self.new != self.old


class _Source:
    """The source with UTF-8 byte offsets for ast's (line, column) positions."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.data = text.encode("utf-8")
        self.line_starts = [0]
        for i, byte in enumerate(self.data):
            if byte == 0x0A:
                self.line_starts.append(i + 1)

    def offset(self, line: int, col: int) -> int:
        return self.line_starts[line - 1] + col

    def span(self, node: ast.AST) -> tuple[int, int]:
        return (self.offset(node.lineno, node.col_offset), self.offset(node.end_lineno, node.end_col_offset))

    def segment(self, start: int, end: int) -> str:
        return self.data[start:end].decode("utf-8")

    def first_line(self, node: ast.AST) -> str:
        start, end = self.span(node)
        text = self.segment(start, end).split("\n")[0].strip()
        return text if len(text) <= 100 else text[:97] + "..."


def _dotted(node: ast.AST) -> list[str] | None:
    """``a.b.c`` as ["a", "b", "c"], or None if the expression is not a dotted name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return parts[::-1]


class _Scanner(ast.NodeVisitor):
    def __init__(self, source: _Source, path: str, tree: ast.Module) -> None:
        self.src = source
        self.path = path
        self.findings: list[Finding] = []
        self.aliases: dict[str, str] = {}  # local name -> qualified name it was imported as
        self.parents: dict[ast.AST, ast.AST] = {}
        self.skip_constants: set[ast.AST] = set()  # in annotations, match patterns, f-strings
        self.amp_blocked = False  # a call of a name from torch.cuda.amp could not be rewritten
        for parent in ast.walk(tree):
            for child in ast.iter_child_nodes(parent):
                self.parents[child] = parent
        self._collect_imports(tree)
        self._collect_unrewritable_constants(tree)
        # Replacements spell torch.*: only where the module binds the name torch to torch.
        self.torch_bound = self.aliases.get("torch") == "torch"
        # A file that sets an ``is_cuda`` attribute of its own (``self.is_cuda = ...``) reads
        # it too: its ``.is_cuda`` reads are not a tensor's, so none is rewritten.
        self.own_is_cuda = any(isinstance(n, ast.Attribute) and n.attr == "is_cuda"
                               and not isinstance(n.ctx, ast.Load) for n in ast.walk(tree))

    # -- imports and names -------------------------------------------------------------
    def _collect_imports(self, tree: ast.Module) -> None:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        self.aliases[a.asname] = a.name
                    else:
                        root = a.name.split(".")[0]
                        self.aliases[root] = root
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for a in node.names:
                    self.aliases[a.asname or a.name] = f"{node.module}.{a.name}"

    def _collect_unrewritable_constants(self, tree: ast.Module) -> None:
        roots: list[ast.AST] = []
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                roots += [a.annotation for a in (*node.args.args, *node.args.kwonlyargs,
                                                  *node.args.posonlyargs, node.args.vararg,
                                                  node.args.kwarg) if a is not None and a.annotation]
                roots += [node.returns] if node.returns else []
            elif isinstance(node, ast.AnnAssign):
                roots.append(node.annotation)
            elif isinstance(node, (ast.JoinedStr, ast.match_case)):
                roots.append(node.pattern if isinstance(node, ast.match_case) else node)
        for root in roots:
            self.skip_constants.update(ast.walk(root))

    def qualified(self, node: ast.AST) -> str | None:
        parts = _dotted(node)
        if parts is None or parts[0] not in self.aliases:
            return None
        return ".".join([self.aliases[parts[0]], *parts[1:]])

    # -- findings --------------------------------------------------------------------
    def add(self, node: ast.AST, kind: str, replacement: str = "", note: str = "",
            edits: list[Edit] | None = None) -> None:
        needs_torch = any("torch." in e.text for e in edits or [])
        if edits and needs_torch and not self.torch_bound:
            note = (note + "; " if note else "") + "add `import torch` to use the replacement"
            edits = None
        self.findings.append(Finding(self.path, node.lineno, node.col_offset + 1, kind,
                                     self.src.first_line(node), replacement, note, False,
                                     list(edits or [])))

    def _replace(self, node: ast.AST, text: str) -> Edit:
        start, end = self.src.span(node)
        return Edit(start, end, text)

    def _insert_first_argument(self, call: ast.Call, text: str) -> Edit | None:
        """Inserts ``text`` as the call's first argument, right after its "(" (found with the
        tokenizer after the callee's end, so comments and line breaks are handled)."""
        _, func_end = self.src.span(call.func)
        _, call_end = self.src.span(call)
        tail = self.src.segment(func_end, call_end)
        tokens = _tokens(tail)
        if tokens is None:
            return None
        opening = next((t for t in tokens if t.type == tokenize.OP), None)
        if opening is None or opening.string != "(":
            return None
        line, col = opening.end  # (1-based line, character column) within ``tail``
        lines = list(io.StringIO(tail))  # split as the tokenizer split them
        prefix = "".join(lines[:line - 1]) + lines[line - 1][:col]
        at = func_end + len(prefix.encode("utf-8"))
        has_args = bool(call.args or call.keywords)
        return Edit(at, at, text + (", " if has_args else ""))

    # -- visitors ----------------------------------------------------------------------
    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if node.level == 0 and (module == "torch.cuda.amp" or module.startswith("torch.cuda.amp.")):
            edit = self._module_edit(node, "torch.amp")
            self.add(node, "cuda amp import", "from torch.amp import ...",
                     "torch.amp's GradScaler and autocast take the device type (added at each call)",
                     [edit] if edit else None)
        elif node.level == 0 and (module == "torch.cuda" or module.startswith("torch.cuda.")):
            self.add(node, "torch.cuda import", "", "import from torch.accelerator, or use "
                     "torch.get_device_module() for the current device's module")
        elif node.level == 0 and module == "torch.backends" and any(a.name == "cudnn" for a in node.names):
            self.add(node, "cudnn", "", "cuDNN settings have no effect off CUDA")
        elif node.level == 0 and module.split(".")[0] in _CUDA_LIBRARIES:
            self.add(node, "CUDA-only library", "", _CUDA_LIBRARIES[module.split(".")[0]])
        elif node.level == 0 and module == "torch.utils.cpp_extension" and any(
                a.name == "CUDAExtension" for a in node.names):
            self.add(node, "CUDA extension", "", "a CUDA C++ extension needs a CUDA GPU: write the "
                     "kernel with NKI (nki.jit) or keep the op in PyTorch")
        self.generic_visit(node)

    def _module_edit(self, node: ast.ImportFrom, new_module: str) -> Edit | None:
        """The range of ``node.module`` in ``from MODULE import ...``, found with the tokenizer."""
        start, end = self.src.span(node)
        text = self.src.segment(start, end)
        tokens = _tokens(text)
        if tokens is None:
            return None
        names = []
        for t in tokens[1:]:
            if t.type == tokenize.NAME and t.string == "import":
                break
            names.append(t)
        if not names or names[0].start[0] != 1 or names[-1].end[0] != 1:
            return None
        line = text.split("\n")[0]
        first = len(line[:names[0].start[1]].encode("utf-8"))
        last = len(line[:names[-1].end[1]].encode("utf-8"))
        if "".join(t.string for t in names) != node.module:
            return None
        suffix = node.module.removeprefix("torch.cuda.amp")
        return Edit(start + first, start + last, new_module + suffix)

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            root = a.name.split(".")[0]
            if root in _CUDA_LIBRARIES:
                self.add(node, "CUDA-only library", "", _CUDA_LIBRARIES[root])
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self._name_reference(node)
        if node.attr == "is_cuda" and isinstance(node.ctx, ast.Load) and self.qualified(node) is None:
            self._is_cuda(node)
        self.generic_visit(node)

    def _is_cuda(self, node: ast.Attribute) -> None:
        """``x.is_cuda`` -> ``(x.device.type == <accelerator type>)``: true on neuron, as
        ``is_cuda`` was on the GPU (the parentheses keep ``not``/``==`` around it meaning
        what they did). Only the trailing ``is_cuda`` name and the opening are edited. A
        PackedSequence has ``is_cuda`` but no ``device`` (use ``packed.data.device``)."""
        start, end = self.src.span(node)
        name_start = end - len(b"is_cuda")
        value = self.src.first_line(node.value)
        new = f"({value if value.count('(') == value.count(')') else '...'}.device.type == {DEVICE_TYPE})"
        if self.src.data[name_start:end] != b"is_cuda" or self.own_is_cuda:
            why = "this file sets an is_cuda attribute of its own" if self.own_is_cuda else "rewrite by hand"
            self.add(node, "is_cuda", "", f"{why}: for a tensor, use {new}")
            return
        self.add(node, "is_cuda", new, "a tensor's device type against the current accelerator's",
                 [Edit(start, start, "("), Edit(name_start, end, f"device.type == {DEVICE_TYPE})")])

    def visit_Name(self, node: ast.Name) -> None:
        self._name_reference(node)

    def _is_outermost(self, node: ast.AST) -> bool:
        parent = self.parents.get(node)
        return not (isinstance(parent, ast.Attribute) and parent.value is node)

    def _name_reference(self, node: ast.AST) -> None:
        if not self._is_outermost(node):
            return
        name = self.qualified(node)
        if name is None:
            return
        parent = self.parents.get(node)
        called = isinstance(parent, ast.Call) and parent.func is node
        if name == "torch.cuda" or name.startswith("torch.cuda."):
            self._torch_cuda(node, name.removeprefix("torch.cuda").lstrip("."), parent if called else None)
        elif name.startswith("torch.backends.cudnn"):
            setting = name.split(".")[3] if name.count(".") >= 3 else ""
            self.add(node, "cudnn", "", _CUDNN_NOTES.get(setting, "cuDNN settings have no effect off CUDA"))
        elif name.startswith("torch.backends.cuda"):
            setting = name.split(".")[3] if name.count(".") >= 3 else ""
            self.add(node, "torch.backends.cuda", "", _BACKENDS_CUDA_NOTES.get(
                setting, "CUDA backend settings have no effect off CUDA"))
        elif name in ("torch.amp.GradScaler", "torch.amp.grad_scaler.GradScaler") and called:
            if not parent.args and not any(k.arg == "device" for k in parent.keywords):
                edit = self._insert_first_argument(parent, DEVICE_TYPE)
                self.add(node, "GradScaler on cuda", f"torch.amp.GradScaler({DEVICE_TYPE}, ...)",
                         "torch.amp.GradScaler's device defaults to 'cuda'", [edit] if edit else None)
        elif name in ("torch.nn.DataParallel", "torch.nn.parallel.DataParallel",
                      "torch.nn.parallel.data_parallel.DataParallel", "torch.nn.parallel.data_parallel"):
            self.add(node, "DataParallel", "", "DataParallel scatters and gathers with CUDA's "
                     "communication kernels: use DistributedDataParallel under torchrun, or the "
                     "module itself on one device")
        elif name in ("torch.distributed.Backend.NCCL",):
            self.add(node, "NCCL backend", BACKEND, "the default backend of the current accelerator",
                     [self._replace(node, BACKEND)])
        elif name in ("torch.utils.cpp_extension.CUDAExtension",) and isinstance(node, ast.Attribute):
            self.add(node, "CUDA extension", "", "a CUDA C++ extension needs a CUDA GPU: write the "
                     "kernel with NKI (nki.jit) or keep the op in PyTorch")

    def _torch_cuda(self, node: ast.AST, rest: str, call: ast.Call | None) -> None:
        head = rest.split(".")[0]
        if isinstance(node, ast.Name) and self.aliases.get(node.id, "").startswith("torch.cuda.amp."):
            # A name imported from torch.cuda.amp: the import is rewritten to torch.amp; calls
            # of GradScaler and autocast get the device type their torch.amp versions need.
            self._amp_call(node, rest.split(".")[-1], call, rewrite_name=False)
            return
        if isinstance(node, ast.Name):
            if rest == "":  # `from torch import cuda` then `cuda` alone: nothing to report here
                return
            self.add(node, "torch.cuda", "", "imported from torch.cuda: use torch.accelerator's "
                     "or torch.get_device_module()'s name")
            return
        if head == "amp":
            self._amp_call(node, rest.split(".")[-1], call, rewrite_name=True)
        elif rest in _ACCELERATOR_NAMES:
            new = _ACCELERATOR_NAMES[rest]
            self.add(node, "torch.cuda", new, "", [self._replace(node, new)])
        elif rest in ("manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed",
                      "get_rng_state", "set_rng_state", "get_rng_state_all", "set_rng_state_all"):
            new = f"torch.get_device_module().{rest}"
            self.add(node, "torch.cuda", new, "the current accelerator's RNG (torch.manual_seed "
                     "would also reseed the CPU)", [self._replace(node, new)])
        elif head in _NO_COUNTERPART:
            self.add(node, "torch.cuda", "", _NO_COUNTERPART[head])
        elif head in _LEGACY_TENSOR_TYPES:
            self.add(node, "legacy CUDA tensor type", "",
                     f"use torch.tensor/torch.empty with dtype= and device={ACCELERATOR}")
        elif rest == "":
            self.add(node, "torch.cuda", "torch.get_device_module()", "",
                     [self._replace(node, "torch.get_device_module()")])
        elif _neuron_has(head):
            new = f"torch.get_device_module().{rest}"
            self.add(node, "torch.cuda", new, "the current accelerator's module (torch.neuron here)",
                     [self._replace(node, new)])
        else:
            self.add(node, "torch.cuda", "", "no counterpart on neuron")

    def _amp_call(self, node: ast.AST, name: str, call: ast.Call | None, rewrite_name: bool) -> None:
        targets = {"GradScaler": "torch.amp.GradScaler", "autocast": "torch.autocast"}
        if name in ("custom_fwd", "custom_bwd"):
            self._custom_fwd_bwd(node, name, call, rewrite_name)
            return
        if name not in targets:
            self.add(node, "cuda amp", "", f"torch.amp.{name} takes device_type=; see torch.amp")
            return
        by_keyword: list[Edit] = []
        if name == "autocast" and call is not None and call.args:
            # torch.cuda.amp.autocast(enabled, dtype, cache_enabled) vs torch.autocast(device_type,
            # dtype, enabled, cache_enabled): the positional arguments are named where they stand.
            names = ("enabled", "dtype", "cache_enabled")
            if len(call.args) > len(names) or any(isinstance(a, ast.Starred) for a in call.args) \
                    or any(k.arg is None or k.arg in names[:len(call.args)] for k in call.keywords):
                self.add(node, "cuda amp", "", "pass autocast's arguments by keyword (enabled=, dtype=), "
                         "then use torch.autocast(device_type, ...)")
                self.amp_blocked = self.amp_blocked or not rewrite_name
                return
            by_keyword = [Edit(at, at, f"{n}=") for n, at in
                          zip(names, (self.src.span(a)[0] for a in call.args))]
        edits = [self._replace(node, targets[name])] if rewrite_name else []
        device_given = call is not None and any(k.arg in ("device", "device_type") for k in call.keywords)
        if call is not None and not device_given:
            inserted = self._insert_first_argument(call, DEVICE_TYPE)
            if inserted is None:
                self.add(node, "cuda amp", "", "could not place the device argument: add it by hand")
                self.amp_blocked = self.amp_blocked or not rewrite_name
                return
            edits.append(inserted)
        edits += by_keyword  # after the device type inserted at the same place, if any
        if call is None and not rewrite_name:
            return  # the imported name used without a call (e.g. passed along): nothing to add
        shown = (targets[name] if rewrite_name else name) + (f"({DEVICE_TYPE}, ...)" if call else "")
        self.add(node, "cuda amp", shown, "torch.amp's versions take the device type", edits)

    def _custom_fwd_bwd(self, node: ast.AST, name: str, call: ast.Call | None, rewrite_name: bool) -> None:
        """``@torch.cuda.amp.custom_fwd`` (bare or called with ``cast_inputs=``) ->
        ``@torch.amp.custom_fwd(device_type=..., ...)``: torch.amp's takes the device type by
        keyword, and a bare decorator becomes a call."""
        target = f"torch.amp.{name}"
        keyword = f"device_type={DEVICE_TYPE}"
        if call is not None and (call.args or any(k.arg in (None, "device_type") for k in call.keywords)):
            self.add(node, "cuda amp", "", f"use @{target}({keyword}, cast_inputs=...)")
            self.amp_blocked = self.amp_blocked or not rewrite_name
            return
        if call is None:  # the bare decorator (or the name passed along): called with the device type
            if not isinstance(self.parents.get(node), (ast.FunctionDef, ast.AsyncFunctionDef)):
                if rewrite_name:
                    self.add(node, "cuda amp", "", f"use {target}({keyword})")
                return
            text = f"{target if rewrite_name else name}({keyword})"
            self.add(node, "cuda amp", f"@{target}({keyword})", "torch.amp's takes the device type",
                     [self._replace(node, text)])
            return
        edits = [self._replace(node, target)] if rewrite_name else []
        inserted = self._insert_first_argument(call, keyword)
        if inserted is None:
            self.add(node, "cuda amp", "", f"use @{target}({keyword}, ...)")
            self.amp_blocked = self.amp_blocked or not rewrite_name
            return
        self.add(node, "cuda amp", f"@{target}({keyword}, ...)", "torch.amp's takes the device type",
                 [*edits, inserted])

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "cuda" and self.qualified(func) is None:
            self._dot_cuda(node, func)
        elif self.qualified(func) == "torch.device" and len(node.args) == 1 and not node.keywords \
                and _is_cuda_string(node.args[0]) and node.args[0].value == "cuda":
            self.add(node, "device", ACCELERATOR, "", [self._replace(node, ACCELERATOR)])
            for child in ast.walk(node):  # the string inside is covered by this edit
                self.skip_constants.add(child)
        self.generic_visit(node)

    def _dot_cuda(self, call: ast.Call, func: ast.Attribute) -> None:
        """``x.cuda(...)`` -> ``x.to(...)``: the method's name, then the device if none is given
        (``.to`` takes ``.cuda``'s device and ``non_blocking`` arguments). ``.cuda(None)``
        meant the current device where ``.to(None)`` does not move: a device given as a name
        (``args.gpu``) becomes ``args.gpu if args.gpu is not None else <accelerator>``."""
        start, end = self.src.span(func)
        name_start = end - len(b"cuda")
        if self.src.data[name_start:end] != b"cuda":
            self.add(call, ".cuda()", "", "rewrite by hand: .to(torch.accelerator.current_accelerator())")
            return
        edits = [Edit(name_start, end, "to")]
        if len(call.args) > 1:  # .cuda(device, non_blocking): .to's second argument is a dtype
            second = self.src.span(call.args[1])[0]
            edits.append(Edit(second, second, "non_blocking="))
        has_device = call.args or any(k.arg == "device" for k in call.keywords)
        if not has_device:
            inserted = self._insert_first_argument(call, ACCELERATOR)
            if inserted is None:
                self.add(call, ".cuda()", "", "rewrite by hand: .to(torch.accelerator.current_accelerator())")
                return
            edits.append(inserted)
        note = ""
        if has_device:
            device = call.args[0] if call.args else next(k.value for k in call.keywords if k.arg == "device")
            text = self.src.segment(*self.src.span(device))
            if isinstance(device, ast.Constant) and device.value is None:
                edits.append(self._replace(device, ACCELERATOR))
            elif _dotted(device) is not None and "\n" not in text:  # e.g. args.gpu, possibly None
                edits.append(self._replace(device, f"{text} if {text} is not None else {ACCELERATOR}"))
            else:
                note = "an int index or torch.device; .cuda(None) meant the current device"
        shown = f".to({ACCELERATOR})" if not has_device else ".to(...)"
        self.add(call, ".cuda()", shown, note, edits)

    def visit_Constant(self, node: ast.Constant) -> None:
        if node in self.skip_constants or not isinstance(node.value, str):
            return
        if _is_cuda_string(node):
            new = DEVICE_TYPE if node.value == "cuda" else f'f"{{{DEVICE_TYPE}}}{node.value[4:]}"'
            edit = self._string_edit(node, new)
            self.add(node, "device string", new, "" if edit else "write the device type by hand",
                     [edit] if edit else None)
        elif node.value == "nccl":
            edit = self._string_edit(node, BACKEND)
            self.add(node, "NCCL backend", BACKEND, "the default backend of the current accelerator",
                     [edit] if edit else None)
        elif "nccl" in node.value and ":" in node.value and len(node.value) < 80:
            self.add(node, "NCCL backend", "", "name the neuron backend: 'cpu:gloo,neuron:neuron'")

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        """``f"cuda:{rank}"``: the whole f-string is rewritten from its parse tree (Python 3.11
        gives no positions inside an f-string), on one line only."""
        first = node.values[0] if node.values else None
        if isinstance(first, ast.Constant) and isinstance(first.value, str) and (
                first.value == "cuda" or first.value.startswith("cuda:")):
            device = ast.FormattedValue(ast.parse(DEVICE_TYPE, mode="eval").body, -1, None)
            rest = [ast.Constant(first.value[4:])] if first.value[4:] else []
            new = ast.unparse(ast.JoinedStr([device, *rest, *node.values[1:]]))
            start, end = self.src.span(node)
            one_line = "\n" not in self.src.segment(start, end)
            self.add(node, "device string", new, "" if one_line else "write the device type by hand",
                     [Edit(start, end, new)] if one_line else None)
        self.generic_visit(node)

    def _string_edit(self, node: ast.Constant, text: str) -> Edit | None:
        """The edit replacing a plain one-token string literal (no implicit concatenation, no
        prefix), or None."""
        start, end = self.src.span(node)
        literal = self.src.segment(start, end)
        if not literal or literal[0] not in "'\"" or "\n" in literal:
            return None
        try:
            if ast.literal_eval(literal) != node.value:
                return None
        except (ValueError, SyntaxError):
            return None
        return Edit(start, end, text)


def _is_cuda_string(node: ast.AST) -> bool:
    if not isinstance(node, ast.Constant) or not isinstance(node.value, str):
        return False
    value = node.value
    return value == "cuda" or (value.startswith("cuda:") and value[5:].isdigit())


def _neuron_has(name: str) -> bool:
    """Whether torch.neuron has torch.cuda's ``name`` (only asked when torch is loaded)."""
    import sys

    torch = sys.modules.get("torch")
    module = getattr(torch, "neuron", None) if torch is not None else None
    return module is not None and hasattr(module, name)


def scan(text: str, path: str = "<string>") -> list[Finding]:
    """Every CUDA-only use in the Python source ``text``, in source order.

    Raises:
        SyntaxError: ``text`` is not valid Python.
    """
    tree = ast.parse(text, filename=path)
    scanner = _Scanner(_Source(text), path, tree)
    scanner.visit(tree)
    if scanner.amp_blocked:  # torch.amp's names would then be called without a device type
        for f in scanner.findings:
            if f.kind == "cuda amp import" and f.edits:
                f.edits = []
                f.note += "; not rewritten: a call of an imported name needs editing by hand first"
    findings = sorted(scanner.findings, key=lambda f: (f.line, f.col))
    return _drop_overlaps(findings)


def _drop_overlaps(findings: list[Finding]) -> list[Finding]:
    """Keeps the first of any edits that would touch the same bytes (its finding is reported
    without an edit)."""
    taken: list[tuple[int, int]] = []
    for f in findings:
        ranges = [(e.start, e.end) for e in f.edits]
        if any(s < te and ts < e or (s == e == ts == te) for s, e in ranges for ts, te in taken):
            f.edits = []
            f.note = (f.note + "; " if f.note else "") + "overlaps another rewrite: edit by hand"
        taken += ranges
    return findings


def _apply(data: bytes, edits: Iterator[Edit]) -> bytes:
    out, at = [], 0
    for e in sorted(edits, key=lambda e: (e.start, e.end)):
        out += [data[at:e.start], e.text.encode("utf-8")]
        at = e.end
    out.append(data[at:])
    return b"".join(out)


def migrate(text: str, path: str = "<string>") -> Migration:
    """``text`` with every rewritable CUDA-only use replaced by its neutral spelling.

    The result must parse and keep every line where it was (so tracebacks and reports
    name the user's own lines); if it would not, the file is left as it is and
    ``error`` says why. Raises SyntaxError if ``text`` is not valid Python."""
    findings = scan(text, path)
    edits = [e for f in findings for e in f.edits]
    if not edits:
        return Migration(path, text, text, findings)
    new = _apply(text.encode("utf-8"), iter(edits)).decode("utf-8")
    error = ""
    if new.count("\n") != text.count("\n"):
        error = "the rewrite would move lines"
    else:
        try:
            ast.parse(new, filename=path)
        except SyntaxError as e:
            error = f"the rewrite would not parse ({e.msg}, line {e.lineno})"
    if error:
        for f in findings:
            f.note = (f.note + "; " if f.note else "") + f"not rewritten: {error}"
        return Migration(path, text, text, findings, error)
    for f in findings:
        f.rewritten = bool(f.edits)
    return Migration(path, text, new, findings)
