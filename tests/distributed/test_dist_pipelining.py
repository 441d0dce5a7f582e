"""torch.distributed.pipelining (GPipe and 1F1B) on neuron: a two-stage pipeline's losses and
gradients equal the same model trained in one CPU process."""

from __future__ import annotations

import torch
import torch.nn as nn
from dist_support import run_ranks

from torchneuron.testing import is_on_neuron

MICROBATCHES = 4
SCHEDULES = ("gpipe", "1f1b")


def model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 8))


def stage_layers(full: nn.Sequential, stage: int) -> nn.Sequential:
    """The pipeline's stages: layers 0-1 on stage 0, 2-4 on stage 1."""
    return nn.Sequential(*list(full)[:2]) if stage == 0 else nn.Sequential(*list(full)[2:])


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    return torch.randn(8, 8, generator=g), torch.randn(8, 8, generator=g)


def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return (out - target).square().mean()


def pipeline_step(rank: int, world: int, schedule_name: str) -> dict:
    """One training step of ``schedule_name`` on a fresh copy of the model."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    device = torch.device("neuron", rank)
    layers = stage_layers(model(), rank).to(device)
    stage = PipelineStage(layers, rank, world, device)
    schedule_type = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule_name]
    schedule = schedule_type(stage, n_microbatches=MICROBATCHES, loss_fn=loss_fn)
    x, target = batch()
    losses: list[torch.Tensor] = []
    if rank == 0:
        schedule.step(x.to(device))
    else:
        schedule.step(target=target.to(device), losses=losses)
    on_device = all(is_on_neuron(p.grad, rank) for p in layers.parameters())
    return {"grads": [p.grad.cpu() for p in layers.parameters()],
            "losses": [loss.detach().cpu() for loss in losses], "on_device": on_device}


def single_process() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The pipeline's arithmetic in one CPU process: per-microbatch losses, gradients
    accumulated over the microbatches in order, then divided by their number
    (the schedules' default ``scale_grads=True``)."""
    full = model()
    x, target = batch()
    losses = []
    for xs, ts in zip(x.chunk(MICROBATCHES), target.chunk(MICROBATCHES)):
        loss = loss_fn(full(xs), ts)
        loss.backward()
        losses.append(loss.detach())
    for p in full.parameters():
        p.grad.div_(MICROBATCHES)
    return losses, [p.grad for p in full.parameters()]


def both_schedules(rank: int, world: int) -> dict:
    """GPipe, then 1F1B, in one process group (one launch of the ranks for both)."""
    return {name: pipeline_step(rank, world, name) for name in SCHEDULES}


def test_pipeline_schedules_equal_single_process_cpu(tmp_path):
    first, last = run_ranks(both_schedules, 2, tmp_path)
    losses, grads = single_process()
    for name in SCHEDULES:
        assert first[name]["on_device"] and last[name]["on_device"], name
        assert first[name]["losses"] == [] and len(last[name]["losses"]) == MICROBATCHES, name
        got = last[name]["losses"] + first[name]["grads"] + last[name]["grads"]
        for g, want in zip(got, losses + grads):
            torch.testing.assert_close(g, want, rtol=0, atol=0, msg=name)
