"""The check report's advice on a repeated host sync: a loop, or a helper that several
callers each reach once (told apart by the sync's whole Python stacks)."""

from torchneuron.check import analysis

SITE = "train.py:5 in read_loss"


def report(count, stacks):
    return {"outcome": {"status": "completed"}, "fallbacks": [], "wide_dtypes": [], "steps": 0,
            "compile": {"graph_breaks": 0, "recompiles": 0}, "transfers": {},
            "memory": {"capacity": [], "peak_allocated_bytes": 0, "instance": None},
            "host_syncs": {"total": count, "by_site": [
                {"kind": "item", "site": SITE, "count": count, "description": "a scalar read",
                 "stack": stacks[0]["stack"] if stacks else [], "stacks": stacks}]}}


def advice(data):
    [text] = [r["text"] for r in analysis.recommendations(data) if r["severity"] == "sync"]
    return text


def test_a_sync_repeated_by_one_stack_is_a_loop():
    looped = [{"stack": [SITE, "train.py:20 in <module>"], "calls": 3}]
    assert advice(report(3, looped)).endswith("3 times (every iteration of a loop); keep the value "
                                              "on the device or read it every N steps")
    assert advice(report(3, [])).endswith("(every iteration of a loop); keep the value on the "
                                          "device or read it every N steps")  # no stacks: as before


def test_a_helper_reached_once_from_each_caller_names_the_callers():
    callers = [{"stack": [SITE, "train.py:9 in step", "train.py:30 in <module>"], "calls": 1},
               {"stack": [SITE, "train.py:31 in <module>"], "calls": 1}]
    assert advice(report(2, callers)) == (
        f"a scalar read at {SITE} synchronises the host with the device 2 times, once from each "
        "of 2 callers (train.py:9 in step, train.py:31 in <module>); keep the value on the device "
        "where the callers can")
    assert analysis.strict_offenders(report(2, callers)) == [f"host sync x2: a scalar read at {SITE}"]
