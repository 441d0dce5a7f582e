"""Small real models and a CPU-oracle training harness for the conformance tests.

Every model is built on CPU from a fixed seed with random weights (no downloads), so
the same initial weights can be copied to ``neuron`` and the two runs compared.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.testing import assert_close

from torchneuron.testing import is_on_neuron

VOCAB = 128
BATCH = 2
SEQ = 12
NUM_LABELS = 5
INIT_SEED = 1234
DATA_SEED = 4321
STEP_SEED = 77

# Loss per step: the relative 1e-5.  Gradients and weights: relative 1e-4, with
# an absolute floor for entries near zero, where a relative bound means nothing.
LOSS_TOL = dict(rtol=1e-5, atol=1e-7)
GRAD_TOL = dict(rtol=1e-4, atol=1e-7)
WEIGHT_TOL = dict(rtol=1e-4, atol=1e-7)

Batch = dict[str, torch.Tensor]


# --------------------------------------------------------------------------- models


def _hf_llama() -> nn.Module:
    """A Llama-style decoder: RMSNorm, rotary, GQA (4 heads, 2 KV heads), SwiGLU."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
                      eos_token_id=2)
    return LlamaForCausalLM(cfg)


def _hf_gpt2() -> nn.Module:
    """GPT-2 with its default dropout (0.1): dropout masks must match CPU's under one seed."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=4,
                     bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return GPT2LMHeadModel(cfg)


def _hf_bert() -> nn.Module:
    """BERT masked-LM head, default dropout 0.1 (hidden and attention probabilities)."""
    from transformers import BertConfig, BertForMaskedLM

    cfg = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                     num_attention_heads=4, intermediate_size=64, max_position_embeddings=64)
    return BertForMaskedLM(cfg)


def _hf_t5() -> nn.Module:
    """T5 encoder-decoder: relative position buckets, T5 layer norm, dropout 0.1."""
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                   num_decoder_layers=2, num_heads=4, relative_attention_num_buckets=8,
                   relative_attention_max_distance=16, dropout_rate=0.1,
                   decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    return T5ForConditionalGeneration(cfg)


def _hf_vit() -> nn.Module:
    """ViT image classifier: conv patch embedding, CLS token, dropout 0.1."""
    from transformers import ViTConfig, ViTForImageClassification

    cfg = ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32,
                    num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                    hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                    num_labels=NUM_LABELS)
    return ViTForImageClassification(cfg)


class SmallCNN(nn.Module):
    """Conv-BatchNorm-ReLU blocks with pooling: exercises conv, BN stats and buffers."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(16, NUM_LABELS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


class LSTMTagger(nn.Module):
    """Embedding, 2-layer bidirectional LSTM with inter-layer dropout, per-token head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16)
        self.lstm = nn.LSTM(16, 24, num_layers=2, batch_first=True, bidirectional=True,
                            dropout=0.1)
        self.head = nn.Linear(48, NUM_LABELS)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embed(ids))
        return self.head(out)


# --------------------------------------------------------------------------- batches


def _token_batch(g: torch.Generator) -> Batch:
    """Causal-LM batch; the second row is left-padded so the attention mask matters."""
    ids = torch.randint(3, VOCAB, (BATCH, SEQ), generator=g)
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[1, :3] = 0
    ids[1, :3] = 0
    labels = ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _mlm_batch(g: torch.Generator) -> Batch:
    """Masked-LM batch: loss only on ~30% of positions, the rest labelled -100."""
    ids = torch.randint(3, VOCAB, (BATCH, SEQ), generator=g)
    pick = torch.rand(BATCH, SEQ, generator=g) < 0.3
    pick[:, 0] = True
    labels = ids.masked_fill(~pick, -100)
    return {"input_ids": ids.masked_fill(pick, 2), "attention_mask": torch.ones_like(ids),
            "labels": labels}


def _seq2seq_batch(g: torch.Generator) -> Batch:
    """Encoder input and shorter target; T5 shifts labels right itself."""
    ids = torch.randint(2, VOCAB, (BATCH, SEQ), generator=g)
    labels = torch.randint(2, VOCAB, (BATCH, SEQ // 2), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def _image_batch(g: torch.Generator) -> Batch:
    """16x16 RGB images with class labels."""
    return {"pixel_values": torch.randn(BATCH * 2, 3, 16, 16, generator=g),
            "labels": torch.randint(0, NUM_LABELS, (BATCH * 2,), generator=g)}


def _tag_batch(g: torch.Generator) -> Batch:
    """Token ids with one label per token."""
    return {"ids": torch.randint(0, VOCAB, (BATCH, SEQ), generator=g),
            "labels": torch.randint(0, NUM_LABELS, (BATCH, SEQ), generator=g)}


# --------------------------------------------------------------------------- losses


def _hf_loss(model: nn.Module, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Hugging Face models compute their own loss from ``labels``."""
    out = model(**batch)
    return out.loss, out.logits


def _image_loss(model: nn.Module, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy of a plain image classifier."""
    logits = model(batch["pixel_values"])
    return F.cross_entropy(logits, batch["labels"]), logits


def _tag_loss(model: nn.Module, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token cross-entropy of the tagger."""
    logits = model(batch["ids"])
    return F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten()), logits


@dataclass(frozen=True)
class ModelCase:
    """How to build one model, make its batches and compute its loss."""

    build: Callable[[], nn.Module]
    make_batch: Callable[[torch.Generator], Batch]
    loss: Callable[[nn.Module, Batch], tuple[torch.Tensor, torch.Tensor]]


MODELS: dict[str, ModelCase] = {
    "llama": ModelCase(_hf_llama, _token_batch, _hf_loss),
    "gpt2": ModelCase(_hf_gpt2, _token_batch, _hf_loss),
    "bert": ModelCase(_hf_bert, _mlm_batch, _hf_loss),
    "t5": ModelCase(_hf_t5, _seq2seq_batch, _hf_loss),
    "vit": ModelCase(_hf_vit, _image_batch, _hf_loss),
    "cnn_batchnorm": ModelCase(SmallCNN, _image_batch, _image_loss),
    "lstm": ModelCase(LSTMTagger, _tag_batch, _tag_loss),
}


def build_cpu_model(name: str) -> nn.Module:
    """Builds ``name`` on CPU from INIT_SEED, so every call gives the same weights."""
    torch.manual_seed(INIT_SEED)
    return MODELS[name].build()


def make_batches(name: str, steps: int) -> list[Batch]:
    """CPU batches from a private generator: identical inputs for both devices."""
    g = torch.Generator().manual_seed(DATA_SEED)
    return [MODELS[name].make_batch(g) for _ in range(steps)]


# --------------------------------------------------------------------------- training


@dataclass
class TrainRecord:
    """What one training run produced, kept on its own device for the device checks."""

    losses: list[torch.Tensor] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)
    grads: list[dict[str, torch.Tensor]] = field(default_factory=list)
    initial: dict[str, torch.Tensor] = field(default_factory=dict)
    model: nn.Module | None = None


def to_device(batch: Batch, device: torch.device | str) -> Batch:
    """Copies every tensor of ``batch`` to ``device``."""
    return {k: v.to(device) for k, v in batch.items()}


def train(name: str, model: nn.Module, device: torch.device | str, batches: list[Batch],
          lr: float = 1e-3) -> TrainRecord:
    """Runs one AdamW step per batch on ``device``, re-seeding before each step.

    Re-seeding makes dropout draw the same masks on both devices: ``torch.manual_seed``
    seeds every neuron device with CPU's stream.  Gradients are cloned each step
    (before ``zero_grad``) so every step's gradients can be compared, not only the last.
    """
    model = model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    rec = TrainRecord(model=model, initial={n: p.detach().cpu().clone()
                                            for n, p in model.named_parameters()})
    for step, batch in enumerate(batches):
        torch.manual_seed(STEP_SEED + step)
        opt.zero_grad(set_to_none=True)
        loss, logits = MODELS[name].loss(model, to_device(batch, device))
        loss.backward()
        rec.losses.append(loss.detach())
        rec.logits.append(logits.detach())
        rec.grads.append({n: p.grad.detach().clone() for n, p in model.named_parameters()
                          if p.grad is not None})
        opt.step()
    return rec


def tied_groups(model: nn.Module) -> list[tuple[str, ...]]:
    """Names that share one Parameter object (tied weights), one tuple per shared object."""
    groups: dict[int, list[str]] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(n)
    return sorted(tuple(g) for g in groups.values() if len(g) > 1)


def move_to(model: nn.Module, device: torch.device | str) -> nn.Module:
    """A deep copy of the CPU ``model`` on ``device`` (tied weights stay tied)."""
    return copy.deepcopy(model).to(device)


def train_on_both(name: str, device: str = "neuron",
                  steps: int = 3) -> tuple[TrainRecord, TrainRecord]:
    """Trains the same initial weights on CPU and on ``device``: (cpu record, device record)."""
    cpu_model = build_cpu_model(name)
    dev_model = move_to(cpu_model, device)
    batches = make_batches(name, steps)
    cpu_rec = train(name, cpu_model, "cpu", batches)
    dev_rec = train(name, dev_model, device, batches)
    return cpu_rec, dev_rec


# --------------------------------------------------------------------------- checks


def assert_ran_on_neuron(rec: TrainRecord, index: int | None = None) -> None:
    """Proves the neuron path ran: losses, logits, parameters, grads and buffers live there."""
    tensors = {f"loss[{i}]": t for i, t in enumerate(rec.losses)}
    tensors |= {f"logits[{i}]": t for i, t in enumerate(rec.logits)}
    tensors |= {f"param {n}": p for n, p in rec.model.named_parameters()}
    tensors |= {f"grad {n}": p.grad for n, p in rec.model.named_parameters() if p.grad is not None}
    tensors |= {f"buffer {n}": b for n, b in rec.model.named_buffers()}
    for i, grads in enumerate(rec.grads):
        tensors |= {f"grad[{i}] {n}": g for n, g in grads.items()}
    bad = [k for k, t in tensors.items() if not is_on_neuron(t, index)]
    assert not bad, f"not in neuron{'' if index is None else f':{index}'} memory: {bad[:5]}"


def assert_records_match(cpu: TrainRecord, dev: TrainRecord,
                         loss_tol: dict = LOSS_TOL, grad_tol: dict = GRAD_TOL,
                         weight_tol: dict = WEIGHT_TOL) -> None:
    """Per-step losses, every gradient of every step, final weights and buffers match CPU's."""
    assert len(cpu.losses) == len(dev.losses)
    for i, (lc, ld) in enumerate(zip(cpu.losses, dev.losses)):
        assert_close(ld.cpu(), lc, **loss_tol, msg=lambda m: f"loss of step {i}: {m}")
    for i, (gc, gd) in enumerate(zip(cpu.grads, dev.grads)):
        assert gc.keys() == gd.keys(), f"step {i}: different parameters got gradients"
        assert gc, f"step {i}: no gradients at all"
        for n in gc:
            assert_close(gd[n].cpu(), gc[n], **grad_tol, msg=lambda m: f"grad of {n}, step {i}: {m}")
    dev_params = dict(dev.model.named_parameters())
    for n, p in cpu.model.named_parameters():
        assert_close(dev_params[n].detach().cpu(), p.detach(), **weight_tol,
                     msg=lambda m: f"weight {n} after training: {m}")
    dev_buffers = dict(dev.model.named_buffers())
    for n, b in cpu.model.named_buffers():
        assert_close(dev_buffers[n].cpu(), b, **weight_tol, msg=lambda m: f"buffer {n}: {m}")


def assert_training_moved(rec: TrainRecord) -> None:
    """Guards against a vacuous comparison: finite losses, nonzero gradients, weights updated."""
    losses = torch.stack([l.float().cpu() for l in rec.losses])
    assert torch.isfinite(losses).all(), f"non-finite loss: {losses}"
    assert any(g.cpu().abs().sum() > 0 for grads in rec.grads for g in grads.values()), \
        "every gradient is zero"
    changed = [n for n, p in rec.model.named_parameters()
               if not torch.equal(p.detach().cpu(), rec.initial[n])]
    assert changed, "no parameter changed during training"
