"""Real models train on ``neuron`` exactly as on CPU.

Small Hugging Face ``transformers`` models (Llama, GPT-2, BERT, T5, ViT) built from tiny
configs with random weights, plus a CNN with BatchNorm and an LSTM tagger. CPU PyTorch is
the oracle: the same initial weights take a few AdamW steps on both devices from the
same inputs and the same dropout seed, and losses, every gradient of every step, final
weights and buffers must agree (losses rtol 1e-5, gradients and weights rtol 1e-4).

All but ``test_tiny_llama_train_steps_match_cpu`` are marked ``conformance``: run them
with ``python -m pytest -q -m conformance tests/conformance/test_models.py``.
"""

import copy

import pytest
import torch
from torch.testing import assert_close

pytest.importorskip("transformers")

import model_zoo as zoo  # noqa: E402  (after the importorskip, which it needs)

conformance = pytest.mark.conformance

from expected_failures import MODELS as EXPECTED_FAILURES  # noqa: E402


def _expected(test_id: str) -> list[pytest.MarkDecorator]:
    """The strict-xfail mark for ``test_id`` if EXPECTED_FAILURES lists it, else no mark."""
    if test_id not in EXPECTED_FAILURES:
        return []
    return [pytest.mark.xfail(strict=True, raises=AssertionError,
                              reason=EXPECTED_FAILURES[test_id])]


def _params(test_name: str, values: list[str]) -> list:
    """pytest.param per value, carrying the xfail mark of ``test_name[value]`` if any."""
    return [pytest.param(v, id=v, marks=_expected(f"{test_name}[{v}]")) for v in values]


# --------------------------------------------------------------------------- fast test


def test_tiny_llama_train_steps_match_cpu():
    """The default-run representative: 3 AdamW steps of a 2-layer Llama on neuron == CPU."""
    cpu, dev = zoo.train_on_both("llama")
    zoo.assert_ran_on_neuron(dev)
    zoo.assert_training_moved(dev)
    zoo.assert_records_match(cpu, dev)


# --------------------------------------------------------------------------- training

TRAINED_MODELS = ["gpt2", "bert", "t5", "vit", "cnn_batchnorm", "lstm"]


@conformance
@pytest.mark.parametrize("name", _params("test_train_steps_match_cpu", TRAINED_MODELS))
def test_train_steps_match_cpu(name: str):
    """3 AdamW steps with dropout on: losses, all grads, weights and buffers match CPU.

    The LSTM takes the fused-cell path on neuron and CPU's own path on CPU (docs/device.md),
    so it agrees to float rounding, well inside the tolerances, rather than bitwise.
    """
    cpu, dev = zoo.train_on_both(name)
    zoo.assert_ran_on_neuron(dev)
    zoo.assert_training_moved(dev)
    zoo.assert_records_match(cpu, dev)


@conformance
def test_train_on_second_device_matches_cpu():
    """GPT-2 trained on neuron:1 stays there (nothing on neuron:0) and matches CPU."""
    before = torch.neuron.current_device()
    cpu, dev = zoo.train_on_both("gpt2", device="neuron:1")
    zoo.assert_ran_on_neuron(dev, index=1)
    zoo.assert_training_moved(dev)
    zoo.assert_records_match(cpu, dev)
    assert torch.neuron.current_device() == before


# --------------------------------------------------------------------------- tied weights

TIED_MODELS = ["gpt2", "bert", "t5"]


@pytest.mark.parametrize("name", _params("test_module_to_neuron_keeps_tied_weights", TIED_MODELS))
def test_module_to_neuron_keeps_tied_weights(name: str):
    """``model.to("neuron")`` keeps tied weights tied and Parameter objects, as ``.to("cuda")`` does."""
    cpu_model = zoo.build_cpu_model(name)
    groups = zoo.tied_groups(cpu_model)
    assert groups, f"{name} has no tied weights on CPU: the test checks nothing"
    moved = copy.deepcopy(cpu_model)
    before = list(moved.parameters())
    moved.to("neuron")
    assert [id(p) for p in moved.parameters()] == [id(p) for p in before]
    assert all(zoo.is_on_neuron(p) for p in moved.parameters())
    assert zoo.tied_groups(moved) == groups
    assert len(list(moved.parameters())) == len(list(cpu_model.parameters()))


# --------------------------------------------------------------------------- generate


@conformance
@pytest.mark.parametrize("name", _params("test_greedy_generate_matches_cpu", ["llama", "gpt2"]))
def test_greedy_generate_matches_cpu(name: str):
    """Greedy ``generate()`` (with a left-padded row and KV cache) gives CPU's tokens."""
    cpu_model = zoo.build_cpu_model(name).eval()
    dev_model = copy.deepcopy(cpu_model).to("neuron")
    batch = zoo.make_batches(name, 1)[0]
    kwargs = dict(max_new_tokens=10, do_sample=False, pad_token_id=0)
    expected = cpu_model.generate(input_ids=batch["input_ids"],
                                  attention_mask=batch["attention_mask"], **kwargs)
    got = dev_model.generate(input_ids=batch["input_ids"].to("neuron"),
                             attention_mask=batch["attention_mask"].to("neuron"), **kwargs)
    assert zoo.is_on_neuron(got), got.device
    assert all(zoo.is_on_neuron(p) for p in dev_model.parameters())
    assert expected.shape == (zoo.BATCH, zoo.SEQ + 10), expected.shape
    assert torch.equal(got.cpu(), expected), f"neuron {got.tolist()}\ncpu    {expected.tolist()}"


# --------------------------------------------------------------------------- autocast


@conformance
def test_llama_autocast_bf16_forward_matches_cpu_autocast():
    """Llama forward under neuron autocast (bf16) vs CPU autocast (bf16).

    neuron autocast uses CUDA's op lists and CPU autocast CPU's; they differ (e.g.
    layer_norm is fp32 on CUDA only), but not on the ops this Llama runs: linear and SDPA
    are bf16 in both, RMSNorm and rotary upcast to fp32 explicitly, and the loss is
    computed in fp32. So the comparison is meaningful; tolerances are bf16's
    (one bf16 ulp is 2**-8 relative) since the kernels are the same CPU kernels anyway.
    """
    cpu_model = zoo.build_cpu_model("llama").eval()
    dev_model = copy.deepcopy(cpu_model).to("neuron")
    batch = zoo.make_batches("llama", 1)[0]
    with torch.no_grad():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            expected = cpu_model(**batch)
        with torch.autocast("neuron", dtype=torch.bfloat16):
            got = dev_model(**zoo.to_device(batch, "neuron"))
    assert zoo.is_on_neuron(got.logits) and zoo.is_on_neuron(got.loss)
    assert expected.logits.dtype == torch.bfloat16, "CPU autocast did not run lm_head in bf16"
    assert got.logits.dtype == torch.bfloat16, "neuron autocast did not run lm_head in bf16"
    assert got.loss.dtype == expected.loss.dtype == torch.float32
    assert_close(got.logits.cpu(), expected.logits, rtol=1.6e-2, atol=1e-2)
    assert_close(got.loss.cpu(), expected.loss, rtol=1e-3, atol=1e-3)
