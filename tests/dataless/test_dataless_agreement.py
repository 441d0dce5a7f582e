"""A dataless run records what the normal run records: the same ops (with dtypes,
placement and calls), the same modelled time to the nanosecond, the same compiled and NKI
kernels, transfers and host syncs, and the same peak of allocated memory.

Each case is a whole training step of third-party code as users write it (Hugging Face
models from their configs, torch.optim, torch.utils.checkpoint, torch.compile)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from dataless_support import assert_agree

import torchneuron
from torchneuron.device import dataless


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                        max_position_embeddings=64))


def _llama_steps(fused: bool, steps: int = 2):
    def run():
        torch.manual_seed(0)
        model = _llama().to("neuron")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=fused)
        ids = torch.randint(0, 256, (2, 16)).to("neuron")
        for _ in range(steps):
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
        return model
    return run


@pytest.mark.parametrize("fused", [False, True], ids=["foreach-adamw", "fused-adamw"])
def test_llama_training_steps_agree(fused):
    normal, _ = assert_agree(_llama_steps(fused))
    names = {op for op, *_ in normal.ops}
    assert ("aten::_fused_adamw_" in names) == fused  # the optimizer path the case names ran
    assert {"aten::mm", "aten::_scaled_dot_product_fused_attention_overrideable_backward"} <= names


def test_bert_training_step_agrees():
    from transformers import BertConfig, BertForSequenceClassification

    def run():
        torch.manual_seed(0)
        model = BertForSequenceClassification(BertConfig(
            vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64, max_position_embeddings=32, num_labels=3)).to("neuron")
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        ids = torch.randint(0, 128, (2, 12)).to("neuron")
        labels = torch.tensor([0, 2]).to("neuron")
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels)
        out.loss.backward()
        opt.step()
        return model

    normal, _ = assert_agree(run)
    assert any(op == "aten::bernoulli_.float" for op, *_ in normal.ops)  # BERT's default dropout ran


class _ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.relu(self.conv2(x))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last],
                         ids=["nchw", "channels-last"])
def test_conv_net_training_step_agrees(memory_format):
    def run():
        torch.manual_seed(0)
        model = _ConvNet().to("neuron", memory_format=memory_format)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        x = torch.randn(4, 3, 16, 16).to("neuron", memory_format=memory_format)
        y = torch.randint(0, 10, (4,)).to("neuron")
        F.cross_entropy(model(x), y).backward()
        opt.step()
        return model

    normal, _ = assert_agree(run)
    assert any(op == "aten::convolution_backward_overrideable" for op, *_ in normal.ops)


def test_autocast_and_gradient_checkpointing_agree():
    def run():
        torch.manual_seed(0)
        blocks = nn.ModuleList(nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))
                               for _ in range(3)).to("neuron")
        opt = torch.optim.AdamW(blocks.parameters())
        x = torch.randn(8, 32).to("neuron")
        with torch.autocast("neuron", dtype=torch.bfloat16):
            for block in blocks:
                x = x + checkpoint(block, x, use_reentrant=False)
            loss = x.float().pow(2).mean()
        loss.backward()
        opt.step()
        return blocks

    normal, _ = assert_agree(run)
    assert any("bfloat16" in dtypes for _, dtypes, *_ in normal.ops)  # autocast ran its casts


def test_compiled_training_step_agrees():
    def run():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64), nn.LayerNorm(64)).to("neuron")
        opt = torch.optim.AdamW(model.parameters())
        compiled = torch.compile(model, backend="neuron")  # the graph is cached after the warm-up
        x = torch.randn(32, 64).to("neuron")
        for _ in range(2):
            compiled(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
        return model

    normal, _ = assert_agree(run)
    assert sum(normal.kernel_calls) > 0  # fused kernels ran (and were charged) in both runs


def test_nki_kernel_agrees():
    from torchneuron import nki
    import torchneuron.nki.language as nl

    @nki.jit
    def scaled_add(a, b):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        for i in range(a.shape[0] // 128):
            rows = slice(i * 128, (i + 1) * 128)
            nl.store(out[rows, :], value=nl.multiply(nl.add(nl.load(a[rows, :]), nl.load(b[rows, :])), 0.5))
        return out

    def run():
        a = torch.randn(256, 512, dtype=torch.bfloat16).to("neuron")
        return scaled_add(scaled_add(a, a), a)

    normal, _ = assert_agree(run)
    assert [w[1] for w in normal.work] == ["scaled_add"] and normal.work[0][2] == 2


def test_a_dataless_nki_kernel_is_simulated_once_per_signature():
    """Under dataless execution the shape-only simulation runs once per signature: later calls
    reuse its allocations, outputs and charge, and record exactly what a simulated call does."""
    from torchneuron import nki
    from torchneuron.nki import bridge
    import torchneuron.nki.language as nl

    @nki.jit
    def double_into(a, out):
        for i in range(a.shape[0] // 128):
            rows = slice(i * 128, (i + 1) * 128)
            nl.store(out[rows, :], value=nl.add(nl.load(a[rows, :]), nl.load(a[rows, :])))
        fresh = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(fresh[0:128, :], value=nl.load(a[0:128, :]))
        return fresh, out

    def run():
        a = torch.randn(256, 128, dtype=torch.bfloat16).to("neuron")
        outs = [torch.empty_like(a) for _ in range(3)]
        return [double_into(a, o) for o in outs]

    bridge._shape_only_runs.clear()
    normal, dataless_run = assert_agree(run)
    assert len(bridge._shape_only_runs) == 1  # three calls, one simulation
    assert normal.work[0][2] == 3
    with torchneuron.dataless():
        a = torch.randn(256, 128, dtype=torch.bfloat16, device="neuron")
        out = torch.empty_like(a)
        fresh, same = double_into(a, out)
        assert same.data_ptr() == out.data_ptr() and fresh.shape == a.shape and fresh.device == a.device
        assert not dataless.holds_values(out)


def test_dataless_results_hold_no_values_and_the_normal_run_does():
    run = _llama_steps(fused=False, steps=1)
    with torchneuron.dataless():
        model = run()
    assert not any(dataless.holds_values(p) for p in model.parameters())
    model = run()
    assert all(dataless.holds_values(p) for p in model.parameters())
