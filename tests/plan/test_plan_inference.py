"""Planning generate(): time to first token, time per output token, the KV cache's bytes."""

from __future__ import annotations

from plan_scripts import GENERATE

from torchneuron.plan import plan


def test_generate_is_planned_as_prefill_and_decode_steps(tmp_path):
    script = tmp_path / "generate.py"
    script.write_text(GENERATE)
    (result,) = plan([str(script), "--batch", "2", "--prompt", "64", "--new", "6"],
                     instances=["trn2.3xlarge"], nproc_per_node=1)
    assert result.status == "completed", result.rank["outcome"]
    inference = result.rank["inference"]
    assert inference["module"] == "LlamaForCausalLM"
    assert inference["calls"] == 6 and inference["decode_steps"] == 5  # one prefill, then one call per token
    assert inference["ttft_seconds"] > 0 and inference["tpot_seconds"] > 0
    # After prefill the cache holds K and V of 64 tokens: layers x 2 x batch x KV heads x tokens x head dim, bf16.
    assert inference["kv_cache_bytes_after_prefill"] == 3 * 2 * 2 * 2 * 64 * 32 * 2
    # generate's stopping checks read values the plan never computed: listed, with their line.
    assert any(r["site"].startswith(str(script)) for r in result.rank["data_reads"])
