"""Bookkeeping structures of the NKI cost scheduler: ``BusyIntervals`` (sorted busy intervals of a
shared resource, DMA engine or v2 SBUF/PSUM port, with earliest-gap search over the last
GAP_WINDOW intervals; decisions 9-10), ``dependency_box`` (an operand's rows x bytes-within-row box)
and ``_BoxIndex`` / ``AllocState`` (per-allocation read and write records for RAW, WAR and
WAW hazard queries; decision 7).
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

from torchneuron.nki.cost.constants import GAP_WINDOW
from torchneuron.nki.instruction import Operand


class BusyIntervals:
    """Sorted, disjoint busy intervals of a shared resource, with earliest-gap search.

    Only the last GAP_WINDOW intervals are kept (decisions 9/10): time before the
    oldest kept interval counts as busy (``floor``), which bounds the cost per query.
    """

    __slots__ = ("starts", "ends", "floor")

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.floor = 0.0

    def copy(self) -> "BusyIntervals":
        other = BusyIntervals()
        other.starts = self.starts[:]
        other.ends = self.ends[:]
        other.floor = self.floor
        return other

    def same(self, other: "BusyIntervals") -> bool:
        return self.floor == other.floor and self.ends == other.ends and self.starts == other.starts

    def fit(self, t: float, d: float) -> float:
        if t < self.floor:
            t = self.floor
        ends = self.ends
        n = len(ends)
        if not n or t >= ends[-1]:
            return t
        i = bisect_right(ends, t)
        starts = self.starts
        while i < n:
            if starts[i] >= t + d:
                return t
            if ends[i] > t:
                t = ends[i]
            i += 1
        return t

    def add(self, s: float, e: float) -> None:
        if e <= s:
            return
        starts, ends = self.starts, self.ends
        if not ends or s > ends[-1]:
            starts.append(s)
            ends.append(e)
            if len(ends) > GAP_WINDOW:
                self.floor = ends[0]
                del starts[0], ends[0]
            return
        if s == ends[-1]:
            ends[-1] = max(ends[-1], e)
            return
        i = bisect_right(starts, s)
        if i > 0 and ends[i - 1] >= s:
            i -= 1
            s = starts[i]
            e = max(e, ends[i])
            del starts[i], ends[i]
        while i < len(starts) and starts[i] <= e:
            e = max(e, ends[i])
            del starts[i], ends[i]
        starts.insert(i, s)
        ends.insert(i, e)
        self._trim()

    def _trim(self) -> None:
        if len(self.ends) > GAP_WINDOW:
            self.floor = self.ends[0]
            del self.starts[0], self.ends[0]


def dependency_box(o: Operand) -> tuple[int, int, int, int]:
    """Decision 7: (first row, end row, first byte, end byte) within each row."""
    lo, hi = o.extent
    pitch = o.row_bytes
    if pitch <= 0 or hi <= lo:
        return (0, 1, lo, max(hi, lo + 1))
    r0 = lo // pitch
    r1 = (hi - 1) // pitch + 1
    if r1 - r0 == 1:
        return (r0, r1, lo - r0 * pitch, hi - r0 * pitch)
    c0 = lo - r0 * pitch
    c1 = (hi - 1) - (r1 - 1) * pitch + 1
    if c1 <= c0:
        c0, c1 = 0, pitch
    return (r0, r1, c0, c1)


class _BoxIndex:
    """Boxes of one allocation with a value each, indexed by row range for overlap queries.

    Keys are sorted by first row; a box overlapping rows [r0, r1) must start after
    ``r0 - span`` (``span`` = the tallest box held), so a query scans only nearby keys.
    """

    __slots__ = ("keys", "rows", "span")

    def __init__(self) -> None:
        self.keys: list[tuple[int, int]] = []
        self.rows: dict[tuple[int, int], dict[tuple[int, int], Any]] = {}
        self.span = 0

    def __bool__(self) -> bool:
        return bool(self.keys)

    def overlapping(self, box: tuple[int, int, int, int]) -> list[tuple[tuple[int, int], tuple[int, int], Any]]:
        r0, r1, c0, c1 = box
        keys = self.keys
        lo = bisect_right(keys, (r0 - self.span, 1 << 62))
        hi = bisect_right(keys, (r1 - 1, 1 << 62))
        found = []
        rows = self.rows
        for j in range(lo, hi):
            key = keys[j]
            if key[1] > r0:
                for cols, value in rows[key].items():
                    if cols[0] < c1 and c0 < cols[1]:
                        found.append((key, cols, value))
        return found

    def prune(self, box: tuple[int, int, int, int], limit: float | None) -> None:
        """Drop the boxes ``box`` covers (reads: only those ending by ``limit``)."""
        r0, r1, c0, c1 = box
        keys = self.keys
        if len(keys) == 1:
            key = keys[0]
            if not (r0 <= key[0] and key[1] <= r1):
                return
            row = self.rows[key]
            doomed = [cols for cols, value in row.items() if c0 <= cols[0] and cols[1] <= c1
                      and (limit is None or value <= limit)]
            if len(doomed) == len(row):
                keys.clear()
                self.rows.clear()
                self.span = 0
                return
            for cols in doomed:
                del row[cols]
            return
        for key, cols, value in self.overlapping(box):
            if r0 <= key[0] and key[1] <= r1 and c0 <= cols[0] and cols[1] <= c1 \
                    and (limit is None or value <= limit):
                self.remove(key, cols)

    def get(self, box: tuple[int, int, int, int], default: Any = None) -> Any:
        cols = self.rows.get((box[0], box[1]))
        return default if cols is None else cols.get((box[2], box[3]), default)

    def put(self, box: tuple[int, int, int, int], value: Any) -> None:
        key = (box[0], box[1])
        cols = self.rows.get(key)
        if cols is None:
            cols = self.rows[key] = {}
            self.keys.insert(bisect_right(self.keys, key), key)
            if key[1] - key[0] > self.span:
                self.span = key[1] - key[0]
        cols[(box[2], box[3])] = value

    def remove(self, key: tuple[int, int], cols: tuple[int, int]) -> None:
        row = self.rows[key]
        del row[cols]
        if not row:
            del self.rows[key]
            del self.keys[bisect_right(self.keys, key) - 1]
            if key[1] - key[0] == self.span:
                self.span = max((k[1] - k[0] for k in self.keys), default=0)


class AllocState:
    __slots__ = ("writes", "reads")

    def __init__(self) -> None:
        self.writes = _BoxIndex()  # box -> (end, engine) of the latest write
        self.reads = _BoxIndex()  # box -> latest end of a read since
