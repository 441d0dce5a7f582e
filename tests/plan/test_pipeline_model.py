"""The pipeline schedule's makespan and bubbles, from stage durations (no torch)."""

from __future__ import annotations

import pytest

from torchneuron.plan.pipeline_model import parse_action, simulate


def gpipe(stages: int, microbatches: int) -> dict[int, list[str]]:
    return {s: [f"{s}F{i}" for i in range(microbatches)] + [f"{s}B{i}" for i in range(microbatches)]
            for s in range(stages)}


def one_f_one_b(stages: int, microbatches: int) -> dict[int, list[str]]:
    order = {}
    for s in range(stages):
        warmup = min(stages - s - 1, microbatches)
        actions = [f"{s}F{i}" for i in range(warmup)]
        for i in range(microbatches - warmup):
            actions += [f"{s}F{warmup + i}", f"{s}B{i}"]
        actions += [f"{s}B{i}" for i in range(microbatches - warmup, microbatches)]
        order[s] = actions
    return order


@pytest.mark.parametrize("schedule", [gpipe, one_f_one_b], ids=["gpipe", "1f1b"])
@pytest.mark.parametrize("stages,microbatches", [(2, 4), (4, 8), (4, 2)])
def test_equal_stages_have_the_textbook_bubble(schedule, stages, microbatches):
    tf, tb = 1.0, 2.0
    durations = {(s, k): (tf if k == "F" else tb) for s in range(stages) for k in "FB"}
    timeline = simulate(schedule(stages, microbatches), durations, stages)
    assert timeline.makespan == pytest.approx((microbatches + stages - 1) * (tf + tb))
    for rank in range(stages):
        assert timeline.busy[rank] == pytest.approx(microbatches * (tf + tb))
        assert timeline.bubble[rank] == pytest.approx((stages - 1) * (tf + tb))


def test_transfers_and_the_slowest_stage_lengthen_the_pipeline():
    durations = {(0, "F"): 1.0, (0, "B"): 2.0, (1, "F"): 1.0, (1, "B"): 4.0}
    timeline = simulate(gpipe(2, 3), durations, 2, transfer_seconds=0.5)
    # stage 1: its forwards end at 3 + 0.5 + 1, then three 4 s backwards; stage 0's last
    # backward starts 0.5 s after stage 1's last one ends
    assert timeline.makespan == pytest.approx(3 + 0.5 + 1 + 3 * 4 + 0.5 + 2)
    assert timeline.bubble[0] == pytest.approx(timeline.makespan - 9)


def test_split_backward_and_bad_schedules():
    assert parse_action("3W12") is not None and parse_action("0REDUCE_GRAD") is None
    order = {0: ["0F0", "0I0", "0W0"], 1: ["1F0", "1I0", "1W0"]}
    durations = {(s, k): 1.0 for s in range(2) for k in "FIW"}
    assert simulate(order, durations, 2).makespan == pytest.approx(5.0)  # F F I(1) then I(0), W(0)
    with pytest.raises(ValueError, match="cannot finish"):
        simulate({0: ["0B0", "0F0"]}, {(0, "F"): 1.0, (0, "B"): 1.0}, 1)
    with pytest.raises(ValueError, match="no measured duration for stage 0 F"):
        simulate({0: ["0F0"]}, {}, 1)
