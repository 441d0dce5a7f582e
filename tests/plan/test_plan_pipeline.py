"""A planned pipeline-parallel job runs one representative per stage and adds the bubble its
schedule implies to the step (torch.distributed.pipelining's GPipe and 1F1B, unmodified)."""

from __future__ import annotations

import pytest

from plan_scripts import PIPELINE, PIPELINE_INTERLEAVED

from torchneuron.plan import plan


@pytest.mark.parametrize("schedule", [pytest.param("gpipe", marks=pytest.mark.slow), "1f1b"])
def test_a_planned_pipeline_has_its_schedules_bubble(schedule, tmp_path):
    script = tmp_path / "pp.py"
    script.write_text(PIPELINE)
    (result,) = plan([str(script), "--schedule", schedule], instances=["trn2.3xlarge"], nproc_per_node=2)
    assert result.status == "completed", result.rank["outcome"]
    pipeline = result.pipeline
    assert pipeline["num_stages"] == 2 and pipeline["n_microbatches"] == 4
    assert pipeline["representatives"] == [0, 1] and "one rank per pipeline stage" in result.represents
    # Every stage's forward and backward were measured on its own representative.
    durations = {tuple(k.split(":")): v for k, v in pipeline["durations"].items()}
    assert set(durations) == {("0", "F"), ("0", "B"), ("1", "F"), ("1", "B")} and min(durations.values()) > 0
    # The bubble is the schedule's: the makespan of the stages' own orders, less each stage's work.
    tf, tb = durations[("0", "F")], durations[("0", "B")]
    for rank in (0, 1):
        assert pipeline["busy_seconds"][rank] == pytest.approx(
            4 * (durations[(str(rank), "F")] + durations[(str(rank), "B")]))
        assert pipeline["bubble_seconds"][rank] == pytest.approx(
            pipeline["makespan_seconds"] - pipeline["busy_seconds"][rank])
    assert pipeline["bubble_seconds"][0] >= tf + tb  # (p - 1) stage times at least
    steps = pipeline["stage_steps"]
    assert [s["pipeline_rank"] for s in steps] == [0, 1]
    assert all(s["bubble_seconds"] > 0 and s["seconds"] > s["compute_seconds"] for s in steps)
    assert result.steady_step["seconds"] == max(s["seconds"] for s in steps)


@pytest.mark.slow
def test_an_interleaved_schedule_has_a_smaller_bubble_for_the_same_work(tmp_path):
    """Two stages of one block per rank (interleaved 1F1B) against one stage of two blocks per
    rank (1F1B): the same work per rank, and the interleaved pipeline idles less."""
    interleaved, plain = tmp_path / "interleaved.py", tmp_path / "plain.py"
    interleaved.write_text(PIPELINE_INTERLEAVED)
    plain.write_text(PIPELINE)
    (a,) = plan([str(interleaved)], instances=["trn2.3xlarge"], nproc_per_node=2)
    (b,) = plan([str(plain), "--schedule", "1f1b"], instances=["trn2.3xlarge"], nproc_per_node=2)
    assert a.pipeline["schedule"] == "ScheduleInterleaved1F1B" and a.pipeline["num_stages"] == 4
    assert a.pipeline["busy_seconds"][0] == pytest.approx(b.pipeline["busy_seconds"][0], rel=0.05)
    fraction = {name: p.pipeline["bubble_seconds"][0] / p.pipeline["makespan_seconds"]
                for name, p in (("interleaved", a), ("1f1b", b))}
    assert fraction["interleaved"] < fraction["1f1b"]
