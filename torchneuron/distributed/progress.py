"""Each rank's progress through a neuron group's collectives, so failures name the missing ranks.

Why: a rank that never joins a collective leaves the others in gloo until the group's
timeout, and gloo's error (``Timed out waiting ... for recv``, ``Connection closed by
peer``) names neither the collective nor the rank. Here every collective of a neuron
group writes the rank's sequence number and op to the group's store (one store write,
microseconds next to the collective itself); when a synchronous collective fails, the
rank reads every rank's record and raises a ``DistBackendError`` naming the collective,
its sequence number, the ranks that never reached it and what they did last, and ranks
that reached it with a different collective.

Point-to-point ops are numbered per (sender, receiver, tag): the k-th send from rank a
to rank b with tag t matches b's k-th receive from a with tag t, as gloo matches them.
Each side publishes its last number and what it carried (shape and dtype), so a receive
that fails names the peer and what it last sent, and a receive whose sender's send of
the same number carried another shape or dtype raises naming both sides instead of
handing over mismatched bytes silently. ``recv`` from any source is not numbered.
"""

from __future__ import annotations

import collections
import datetime
from dataclasses import dataclass, field

import torch.distributed as dist

from torchneuron.distributed.agreement import SLOTS as _AGREE_SLOTS
from torchneuron.distributed.agreement import SlotTable, fit, local_table

_KEY = "torchneuron/progress/"
# Point-to-point records each side keeps published per (peer, tag): a receive is checked
# against its send as long as the sender has not made this many more sends since.
_P2P_WINDOW = 16
# Collectives each rank keeps published: a failing rank finds a peer's record of the same
# number as long as the peer has not made this many more collectives since.
_COLLECTIVE_WINDOW = 8
# _AGREE_SLOTS (agreement.SLOTS): slots where the first rank to reach a collective leaves its
# op and tensors for the others to compare (:meth:`GroupProgress.agree`); reused round-robin.
# Collectives whose ranks legitimately pass tensors of different shapes (roots, uneven splits).
_SHAPES_MAY_DIFFER = frozenset({"gather", "scatter", "all_to_all", "all_to_all_single"})
# How torch's ProcessGroupWrapper (TORCH_DISTRIBUTED_DEBUG=DETAIL) starts the error it raises
# when the ranks' fingerprints of a collective differ (torch 2.13.0).
DETAIL_MISMATCH = "Detected mismatch between collectives"


@dataclass
class GroupProgress:
    """One rank's collectives on one group, and the store every rank of the group shares."""

    name: str
    store: dist.Store
    rank: int  # in the group
    global_ranks: list[int]
    timeout: datetime.timedelta
    seq: int = 0
    sent: dict[tuple[int, int], int] = field(default_factory=dict)  # (peer, tag) -> sends
    received: dict[tuple[int, int], int] = field(default_factory=dict)  # (peer, tag) -> receives
    recent: dict[tuple[str, int, int], collections.deque] = field(default_factory=dict)  # published
    published: collections.deque = field(  # this rank's last collectives, as in the store
        default_factory=lambda: collections.deque(maxlen=_COLLECTIVE_WINDOW))
    agreed: dict[int, str] = field(default_factory=dict)  # slot -> what its compare_set last found
    # Made under TORCH_DISTRIBUTED_DEBUG=DETAIL: torch's ProcessGroupWrapper compares every
    # collective's fingerprint among the ranks itself (and leaves the group usable after a mismatch).
    checked_by_torch: bool = False
    # Where the ranks agree when all are on this host (:mod:`agreement`); else the store's keys.
    slots: SlotTable | None = None

    def arrive(self, op: str, what: str = "") -> int:
        """Numbers this rank's next collective and publishes it to the group with ``what`` it
        carries (shapes and dtypes); returns its number. One store write: the value holds this
        rank's last few collectives, so a peer that fails on one finds it after this rank
        has moved on."""
        self.seq += 1
        self.published.append(f"{self.seq} {op} {fit(what)}")
        if self.slots is not None:  # all ranks on this host: no message to the store's process
            self.slots.publish(self.rank, "\n".join(self.published))
        else:
            self.store.set(f"{_KEY}{self.rank}", "\n".join(self.published))
        return self.seq

    def agree(self, op: str, what: str) -> dist.DistBackendError | None:
        """Checks this rank's collective number ``self.seq`` against the first rank to reach it;
        returns the error naming both sides when they differ, before any data moves.

        Why: gloo kills a rank whose receive buffer is smaller than what a peer sends (its TCP
        thread throws ``EnforceNotMet``: SIGABRT, torch 2.13.0), so a collective called with
        other byte counts (or in another order) must be caught before it reaches gloo. One
        ``compare_set`` per collective (a store round trip, ~10-20 us): the first rank to reach
        number ``n`` writes its op and tensors into slot ``n % _AGREE_SLOTS``, every later rank
        gets that back and compares. Ranks that both issue a collective always carry the same
        op and tensors, since each compared with the same first rank; the first one waits in
        gloo for a peer that never sends and fails naming both sides (:meth:`failure`).
        When all ranks are on this host, the slots are a file they share (:mod:`agreement`):
        no round trip to the store's process.
        """
        if len(self.global_ranks) == 1 or self.checked_by_torch:
            return None
        slot = self.seq % _AGREE_SLOTS
        what = fit(what)  # a long one: its start and a digest (the same on every rank)
        mine = f"{self.seq} {self.rank} {op} {what}"
        try:
            if self.slots is not None:
                found = self.slots.compare_set(slot, self.agreed.get(slot, ""), mine)
            else:
                found = self.store.compare_set(f"{_KEY}agree/{slot}", self.agreed.get(slot, ""), mine).decode()
        except Exception:  # noqa: BLE001 - the store is gone: the collective's own failure says so
            return None
        seq, _, rest = found.partition(" ")
        if seq != str(self.seq):  # a rank far ahead (async work) holds the slot: not checked
            return None
        self.agreed[slot] = found
        first, _, rest = rest.partition(" ")
        their_op, _, their_what = rest.partition(" ")
        if their_op == op and (their_what == what or op in _SHAPES_MAY_DIFFER):
            return None
        me = f"rank {self.global_ranks[self.rank]}"
        them = f"rank {self.global_ranks[int(first)]}"
        if their_op != op:
            differs = f"{them} called {their_op} ({their_what}) as #{self.seq}"
        else:
            differs = f"{them}'s {op} #{self.seq} carries {their_what}"
        return dist.DistBackendError(
            f"{op} (collective #{self.seq} on process group {self.name!r}, {me}, {what}) does not match "
            f"the other ranks: {differs}; every rank must call the same collectives in the same "
            f"order, with tensors of the same shapes and dtypes (this rank raised before any data "
            f"moved; the ranks that reached it first fail within the group's timeout of "
            f"{self.timeout.total_seconds():g} s, and the group cannot be used after this error)")

    def history(self, rank: int) -> dict[int, tuple[str, str]] | None:
        """Group rank ``rank``'s published collectives: number -> (op, what it carried); None
        if it has published none."""
        if self.slots is not None:
            text = self.slots.record(rank)
            if not text:
                return None
        else:
            key = f"{_KEY}{rank}"
            if not self.store.check([key]):
                return None
            text = self.store.get(key).decode()
        found = {}
        for line in text.split("\n"):
            seq, _, rest = line.partition(" ")
            op, _, what = rest.partition(" ")
            found[int(seq)] = (op, what)
        return found

    def records(self) -> list[tuple[int, str] | None]:
        """Every group rank's last published (number, op), None for a rank with none."""
        found: list[tuple[int, str] | None] = []
        for r in range(len(self.global_ranks)):
            history = self.history(r)
            if not history:
                found.append(None)
                continue
            seq = max(history)
            found.append((seq, history[seq][0]))
        return found

    def failure(self, op: str, seq: int, error: BaseException, what: str = "") -> dist.DistBackendError:
        """The error for collective ``op`` number ``seq``, carrying ``what``, failing with ``error``.

        Names the ranks that never reached it, the ranks that called another collective as
        number ``seq`` and the ranks whose tensors differ, with their op, shapes and dtypes.
        """
        me = f"rank {self.global_ranks[self.rank]}" + (f", {what}" if what else "")
        try:
            histories = [self.history(r) for r in range(len(self.global_ranks))]
        except Exception as store_error:  # the store itself is gone (its host rank died)
            return dist.DistBackendError(
                f"{op} (collective #{seq} on process group {self.name!r}, {me}) failed, and the "
                f"group's store could not be read to find the missing ranks ({store_error}); gloo: {error}")
        missing, other_op, other_tensors = [], [], []
        for r, history in enumerate(histories):
            if r == self.rank:
                continue
            who = f"rank {self.global_ranks[r]}"
            if not history:
                missing.append(f"{who} (no collective yet)")
            elif max(history) < seq:
                last = max(history)
                missing.append(f"{who} (last at #{last} {history[last][0]})")
            elif seq in history:
                their_op, their_what = history[seq]
                if their_op != op:
                    other_op.append(f"{who} called {their_op}" + (f" ({their_what})" if their_what else ""))
                elif what and their_what and their_what != fit(what) and op not in _SHAPES_MAY_DIFFER:
                    other_tensors.append(f"{who} ({their_what})")
        detail = DETAIL_MISMATCH in str(error)
        if detail:
            head = (f"{op} (collective #{seq} on process group {self.name!r}, {me}) was called "
                    f"differently on the ranks (found by TORCH_DISTRIBUTED_DEBUG=DETAIL's check, before "
                    f"any data moved)")
        else:
            head = (f"{op} (collective #{seq} on process group {self.name!r}, {me}) failed within "
                    f"the group's timeout of {self.timeout.total_seconds():g} s")
        parts = [head]
        if missing:
            parts.append(f"ranks that never reached it: {', '.join(missing)}")
        if other_op:
            parts.append(f"ranks that called a different collective as #{seq}: {', '.join(other_op)}")
        if other_tensors:
            parts.append(f"ranks whose {op} #{seq} carries other shapes or dtypes: {', '.join(other_tensors)}")
        if not missing and not other_op and not other_tensors:
            parts.append("every rank reached it")
        if other_op or other_tensors:
            parts.append("every rank must call the same collectives in the same order, with tensors "
                         "of the same shapes and dtypes")
        if not detail:
            parts.append(f"gloo: {str(error).strip()}")
        return dist.DistBackendError("; ".join(parts))

    # ---- point-to-point ---------------------------------------------------------

    def _pair_key(self, sender: int, receiver: int, tag: int, side: str) -> str:
        return f"{_KEY}p2p/{sender}/{receiver}/{tag}/{side}"

    def number_p2p(self, side: str, peer: int, tag: int, what: str) -> int:
        """Numbers this rank's next ``side`` ("send" or "recv") with ``peer`` (a group rank)
        and ``tag``, and publishes the number and ``what`` it carries; returns the number."""
        counts = self.sent if side == "send" else self.received
        number = counts[(peer, tag)] = counts.get((peer, tag), 0) + 1
        window = self.recent.setdefault((side, peer, tag), collections.deque(maxlen=_P2P_WINDOW))
        window.append(f"{number} {what}")
        sender, receiver = (self.rank, peer) if side == "send" else (peer, self.rank)
        self.store.set(self._pair_key(sender, receiver, tag, side), "\n".join(window))
        return number

    def _peer_records(self, side: str, peer: int, tag: int) -> dict[int, str]:
        """The peer's last published numbers of its ``side`` with this rank -> what each carried."""
        sender, receiver = (peer, self.rank) if side == "send" else (self.rank, peer)
        key = self._pair_key(sender, receiver, tag, side)
        if not self.store.check([key]):
            return {}
        found = {}
        for line in self.store.get(key).decode().split("\n"):
            number, _, what = line.partition(" ")
            found[int(number)] = what
        return found

    def _peer_record(self, side: str, peer: int, tag: int,
                     number: int | None = None) -> tuple[int, str] | None:
        """The peer's record ``number`` (if still published), else its latest; None if none."""
        records = self._peer_records(side, peer, tag)
        if not records:
            return None
        chosen = number if number in records else max(records)
        return chosen, records[chosen]

    def _p2p_name(self, side: str, number: int, peer: int, tag: int, what: str) -> str:
        direction = "to" if side == "send" else "from"
        return (f"{side} #{number} {direction} rank {self.global_ranks[peer]} (tag {tag}, {what}; "
                f"process group {self.name!r}, rank {self.global_ranks[self.rank]})")

    def p2p_mismatch(self, side: str, number: int, peer: int, tag: int,
                     what: str) -> dist.DistBackendError | None:
        """The error for a finished receive whose matching send carried something else, or None.

        The peer publishes its last few records: if it has moved further past ``number``,
        nothing is said.
        """
        other = "recv" if side == "send" else "send"
        try:
            record = self._peer_record(other, peer, tag, number)
        except Exception:  # the store is gone; the transfer itself succeeded
            return None
        if record is None or record[0] != number or record[1] == what:
            return None
        return dist.DistBackendError(
            f"{self._p2p_name(side, number, peer, tag, what)} was matched with rank "
            f"{self.global_ranks[peer]}'s {other} #{number}, which carries {record[1]}: the two sides "
            f"disagree on shape or dtype (the received bytes are not what was sent); make the "
            f"k-th send and the k-th recv of each pair and tag use tensors of one shape and dtype")

    def p2p_failure(self, side: str, number: int, peer: int, tag: int, what: str,
                    error: BaseException) -> dist.DistBackendError:
        """The error for this rank's ``side`` #``number`` with ``peer`` failing with ``error``."""
        head = (f"{self._p2p_name(side, number, peer, tag, what)} failed within the group's "
                f"timeout of {self.timeout.total_seconds():g} s")
        other = "recv" if side == "send" else "send"
        try:
            record = self._peer_record(other, peer, tag, number)
        except Exception as store_error:
            return dist.DistBackendError(f"{head}; the group's store could not be read to see what "
                                         f"rank {self.global_ranks[peer]} did ({store_error}); "
                                         f"gloo: {str(error).strip()}")
        who = f"rank {self.global_ranks[peer]}"
        verb = "sends to" if other == "send" else "receives from"
        if record is None:
            said = f"{who} has posted no {other} with this rank and tag {tag}"
        elif record[0] < number:
            said = (f"{who} has posted only {record[0]} {verb} this rank with tag {tag} "
                    f"(last: {other} #{record[0]}, {record[1]})")
        elif record[0] == number and record[1] != what:
            said = f"{who}'s {other} #{number} carries {record[1]} (shape or dtype differ)"
        else:
            said = f"{who} posted its {other} #{number} ({record[1] if record[0] == number else 'and later ones'})"
        return dist.DistBackendError(f"{head}; {said}; gloo: {str(error).strip()}")


_groups: dict[str, GroupProgress] = {}


def track(name: str, store: dist.Store, rank: int, global_ranks: list[int],
          timeout: datetime.timedelta) -> None:
    """Starts numbering the collectives of the group named ``name`` (when its backend is made)
    and watching them (:mod:`watchdog`)."""
    from torchneuron import config
    from torchneuron.distributed import watchdog

    checked_by_torch = dist.get_debug_level() == dist.DebugLevel.DETAIL
    slots = None if checked_by_torch else local_table(store, rank, len(global_ranks), timeout)
    _groups[name] = GroupProgress(name, store, rank, list(global_ranks), timeout,
                                  checked_by_torch=checked_by_torch, slots=slots)
    limit = config.value("TORCHNEURON_COLLECTIVE_WATCHDOG_SECONDS")
    watchdog.watch(name, timeout.total_seconds() if limit is None else float(limit))


def group_named(name: str) -> GroupProgress | None:
    """The progress record of the group named ``name``, if tracked."""
    return _groups.get(name)


def progress_of(group: dist.ProcessGroup) -> GroupProgress | None:
    """The progress record of ``group`` (None for a group made before tracking started)."""
    return _groups.get(group.group_name)
