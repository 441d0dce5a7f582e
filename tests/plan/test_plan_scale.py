"""A Llama-3-70B-shaped training job plans on this machine: one dataless rank of 256 holds the
model's shapes, its memory and its time in under 2 GB of host memory."""

from __future__ import annotations

import os

import pytest

from torchneuron.plan import plan

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "planning", "llama_fsdp_tp.py")
LLAMA_70B = ["--layers", "80", "--dim", "8192", "--ffn", "28672", "--heads", "64", "--kv", "8",
             "--vocab", "128256", "--batch", "1", "--steps", "1"]


@pytest.mark.slow  # 25 s: the default run plans smaller jobs; scripts/conformance.py --suite slow runs it
def test_a_70b_training_step_plans_in_under_2_gb_of_host_memory():
    (result,) = plan([EXAMPLE, "--tp", "8", "--seq", "4096", "--ac", "full", *LLAMA_70B], nodes=[4])
    assert result.status == "completed", result.rank["outcome"]
    assert result.configuration.world.world_size == 256
    assert result.fits and 10 * 2**30 < result.peak_bytes <= result.capacity_bytes  # GiBs of device memory
    assert result.rank["host_peak_rss_bytes"] < 2e9, result.rank["settings"]  # ... that the host never holds
    step = result.steady_step
    # 70B parameters sharded over 256 ranks: about 70e9 * 6 FLOPs per token (plus recompute) per rank
    tokens = result.tokens_per_step
    assert tokens == 4096 * 256 // 8
    flops_per_rank_token = step["flops"] / (tokens * 8 / 256)
    assert 6 * 60e9 / 8 < flops_per_rank_token < 8.5 * 80e9 / 8
