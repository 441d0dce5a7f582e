"""Split ATen operator names into the parts the support table and cost model key on.

``"aten::add_.Tensor"`` is namespace ``aten``, overload ``Tensor`` and base
``add`` (the in-place ``_`` dropped, so ``add``, ``add_`` and ``add.out`` share
every rule). Parsing is cached: callers pass the same few hundred names millions
of times.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

__all__ = ["OpName", "parse_op_name"]

# namespace::name.overload; the namespace and overload are optional.
_OP_NAME = re.compile(r"(?:(?P<ns>[A-Za-z_][A-Za-z0-9_]*)::)?(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:\.(?P<overload>[A-Za-z0-9_]+))?")


@dataclass(frozen=True)
class OpName:
    """A parsed operator name. ``base`` is the functional name (no trailing in-place ``_``)."""

    namespace: str
    name: str
    overload: str
    base: str
    inplace: bool

    @property
    def qualified(self) -> str:
        """``namespace::name[.overload]``, the form error messages quote."""
        suffix = f".{self.overload}" if self.overload else ""
        return f"{self.namespace}::{self.name}{suffix}"


@lru_cache(maxsize=4096)
def parse_op_name(op_name: str) -> OpName:
    """Parse ``"aten::add_.Tensor"``-style names; a bare ``"add"`` means ``aten::add``.

    Raises:
        TypeError: if ``op_name`` is not a string.
        ValueError: if it is not ``namespace::name[.overload]``.
    """
    if not isinstance(op_name, str):
        raise TypeError(
            f"op name must be a str like 'aten::add.Tensor', got {type(op_name).__name__} {op_name!r}"
        )
    match = _OP_NAME.fullmatch(op_name.strip())
    if match is None:
        raise ValueError(
            f"cannot parse op name {op_name!r}; write it as OperatorHandle names it, "
            "'namespace::name[.overload]', e.g. 'aten::add.Tensor' or 'aten::linalg_eigh'"
        )
    name = match.group("name")
    # Dunder ops (aten::__and__) and private ops ending in "_" only when in-place.
    inplace = name.endswith("_") and not name.endswith("__")
    return OpName(
        namespace=match.group("ns") or "aten",
        name=name,
        overload=match.group("overload") or "",
        base=name[:-1] if inplace else name,
        inplace=inplace,
    )
