"""Eager overhead of the neuron device against plain CPU, in one process.

The neuron device runs CPU kernels on device memory, so any time above CPU is
the backend's own overhead (dispatch, aliasing, allocator). Each case runs on
both devices from the same inputs; timings alternate CPU and neuron in rounds
(interleaved, so drift and noise hit both alike) and report medians.

    python benchmarks/eager_overhead.py [--quick] [--threads N]
"""

from __future__ import annotations

import argparse
import datetime
import platform
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

import torchneuron
from torchneuron.profiler.interleaved import time_interleaved


@dataclass
class Case:
    """A benchmark case: a builder returning one step function per device."""

    name: str
    build: Callable[[str], tuple[Callable[[], object], Callable[[], object]]]
    target: float | None  # max neuron/CPU ratio, None for "no target"
    # Builds the step checked against CPU, if not `build` (cases with dropout
    # check without it: masks come from each device's own generator).
    check_build: Callable[[str], tuple] | None = None


# ---- cases --------------------------------------------------------------------


def _binary_add(n: int) -> Callable[[str], tuple]:
    def build(device: str) -> tuple:
        g = torch.Generator().manual_seed(0)
        a, b = (torch.randn(n, generator=g).to(device) for _ in range(2))
        if n == 64 * 64:
            a, b = a.view(64, 64), b.view(64, 64)
        return (lambda: a + b), (lambda: a + b)
    return build


def _matmul(device: str) -> tuple:
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(512, 512, generator=g).to(device) for _ in range(2))
    return (lambda: a @ b), (lambda: a @ b)


def _train_step(model: nn.Module, inputs: torch.Tensor, loss_fn: Callable) -> tuple:
    """One AdamW step function, and a function returning the parameters to compare."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(inputs))
        loss.backward()
        opt.step()
        return loss

    return step, lambda: [p.detach() for p in model.parameters()]


def _mlp(sizes: tuple[int, ...], batch: int) -> Callable[[str], tuple]:
    """An MLP (Linear layers of `sizes`, ReLU between) trained with AdamW on cross-entropy."""
    def build(device: str) -> tuple:
        torch.manual_seed(0)
        layers: list[nn.Module] = []
        for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
            layers += [nn.Linear(a, b)] + ([nn.ReLU()] if i < len(sizes) - 2 else [])
        model = nn.Sequential(*layers).to(device)
        g = torch.Generator().manual_seed(1)
        x = torch.randn(batch, sizes[0], generator=g).to(device)
        y = torch.randint(0, sizes[-1], (batch,), generator=g).to(device)
        return _train_step(model, x, lambda out: F.cross_entropy(out, y))
    return build


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(dim)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Block(nn.Module):
    """Pre-norm decoder block: causal self-attention and a SwiGLU MLP."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = RMSNorm(dim), RMSNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim, bias=False), nn.Linear(dim, dim, bias=False)
        hidden = 4 * dim * 2 // 3
        self.gate, self.up = nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, d // self.heads).unbind(2)
        attn = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, s, d))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class TinyLlama(nn.Module):
    def __init__(self, vocab: int = 512, dim: int = 128, layers: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm, self.head = RMSNorm(dim), nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def _llama(device: str) -> tuple:
    torch.manual_seed(0)
    model = TinyLlama().to(device)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 512, (4, 65), generator=g).to(device)
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    return _train_step(model, inputs, lambda logits: F.cross_entropy(
        logits.reshape(-1, 512), labels.reshape(-1)))


class WordLM(nn.Module):
    """The word-language-model shape: embedding, dropout, a recurrent stack, dropout,
    a decoder over the whole vocabulary, log-softmax (PyTorch's example's defaults)."""

    def __init__(self, rnn: str, vocab: int, emsize: int, nhid: int, layers: int, dropout: float,
                 bidirectional: bool = False) -> None:
        super().__init__()
        self.encoder, self.drop = nn.Embedding(vocab, emsize), nn.Dropout(dropout)
        self.rnn = getattr(nn, rnn)(emsize, nhid, layers, dropout=dropout if layers > 1 else 0.0,
                                      bidirectional=bidirectional)
        self.decoder = nn.Linear(nhid * (2 if bidirectional else 1), vocab)

    def forward(self, tokens: torch.Tensor, hidden: object) -> tuple[torch.Tensor, object]:
        out, hidden = self.rnn(self.drop(self.encoder(tokens)), hidden)
        return F.log_softmax(self.decoder(self.drop(out)), dim=-1), hidden


WLM_VOCAB, WLM_BPTT = 33278, 35  # Wikitext-2's vocabulary, the example's sequence length


def _word_lm(rnn: str, *, train: bool, layers: int = 2, bidirectional: bool = False,
             dropout: float = 0.2) -> Callable[[str], tuple]:
    """A train step (truncated BPTT, gradient clipping 0.25, plain SGD as the example)
    or an evaluation step (no_grad, batch 10 as the example evaluates)."""
    def build(device: str) -> tuple:
        torch.manual_seed(0)
        model = WordLM(rnn, WLM_VOCAB, 200, 200, layers, dropout, bidirectional).to(device)
        batch = 20 if train else 10
        g = torch.Generator().manual_seed(1)
        tokens = torch.randint(0, WLM_VOCAB, (WLM_BPTT + 1, batch), generator=g).to(device)
        inputs, targets = tokens[:-1], tokens[1:].reshape(-1)
        h0 = torch.zeros(layers * (2 if bidirectional else 1), batch, 200, device=device)
        state = {"hidden": (h0, h0.clone()) if rnn == "LSTM" else h0}
        model.train(train)

        def step() -> torch.Tensor:
            hidden = state["hidden"]
            hidden = tuple(h.detach() for h in hidden) if isinstance(hidden, tuple) else hidden.detach()
            with torch.set_grad_enabled(train):
                out, state["hidden"] = model(inputs, hidden)
                loss = F.nll_loss(out.view(-1, WLM_VOCAB), targets)
            if train:
                model.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
                with torch.no_grad():
                    for p in model.parameters():
                        p.add_(p.grad, alpha=-20.0)
            return loss

        if train:
            return step, lambda: [p.detach() for p in model.parameters()]
        return step, lambda: [step().detach()]
    return build


def _rnn_alone(rnn: str) -> Callable[[str], tuple]:
    """The recurrent stack alone (no embedding or decoder, whose matmul over the
    vocabulary dominates the word-LM step): forward and backward at the word-LM shape."""
    def build(device: str) -> tuple:
        torch.manual_seed(0)
        model = getattr(nn, rnn)(200, 200, 2).to(device)
        x = torch.randn(WLM_BPTT, 20, 200, generator=torch.Generator().manual_seed(1)).to(device)

        def step() -> torch.Tensor:
            model.zero_grad(set_to_none=True)
            out = model(x)[0]
            out.sum().backward()
            return out
        return step, lambda: [p.grad for p in model.parameters()]
    return build


def _rnn_case(name: str, rnn: str, target: float | None, **kw) -> Case:
    return Case(name, _word_lm(rnn, **kw), target, check_build=_word_lm(rnn, **kw, dropout=0.0))


CASES = [
    Case("add 64x64 fp32", _binary_add(64 * 64), 1.25),
    Case("add 16M fp32 (memory-bound)", _binary_add(16 * 2**20), 1.1),
    Case("matmul 512x512 fp32", _matmul, None),
    Case("small MLP 64-128-10 AdamW step (batch 32)", _mlp((64, 128, 10), 32), 1.15),
    Case("MLP 3x256 AdamW step (batch 64)", _mlp((256, 256, 256, 10), 64), 1.2),
    Case("tiny Llama AdamW step (2 blocks, d128, seq 64, batch 4)", _llama, 1.05),
    _rnn_case("word LM LSTM 2x200 train step (bptt 35, batch 20)", "LSTM", 1.3, train=True),
    _rnn_case("word LM LSTM 2x200 eval step (bptt 35, batch 10)", "LSTM", 1.3, train=False),
    _rnn_case("word LM GRU 2x200 train step (bptt 35, batch 20)", "GRU", 1.3, train=True),
    _rnn_case("word LM GRU 2x200 eval step (bptt 35, batch 10)", "GRU", 1.3, train=False),
    Case("nn.LSTM 2x200 alone, forward + backward (seq 35, batch 20)", _rnn_alone("LSTM"), 1.3),
    Case("nn.GRU 2x200 alone, forward + backward (seq 35, batch 20)", _rnn_alone("GRU"), 1.3),
    _rnn_case("word LM LSTM 1x200 train step", "LSTM", 1.3, train=True, layers=1),
    _rnn_case("word LM bidirectional LSTM 2x200 train step", "LSTM", 1.3, train=True,
              bidirectional=True),
]


# ---- measurement ----------------------------------------------------------------


def check(case: Case) -> dict[str, Callable]:
    """Builds the case on both devices, runs it once and checks neuron == CPU."""
    build = case.check_build or case.build
    outs = {}
    for device in ("cpu", "neuron"):
        run, result = build(device)
        run()
        outs[device] = result()
    got = outs["neuron"] if isinstance(outs["neuron"], list) else [outs["neuron"]]
    want = outs["cpu"] if isinstance(outs["cpu"], list) else [outs["cpu"]]
    assert all(t.device.type == "neuron" for t in got), f"{case.name}: result not on neuron"
    torch.testing.assert_close([t.cpu() for t in got], want, msg=lambda m: f"{case.name}: {m}")
    return {d: case.build(d)[0] for d in ("cpu", "neuron")}


def measure(runs: dict[str, Callable], rounds: int, sample_ns: float) -> dict[str, float]:
    """Median microseconds per call on each device, alternating devices each round."""
    return time_interleaved(runs, rounds=rounds, sample_ns=sample_ns)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a rough figure in ~15 s)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--only", default="", help="run the cases whose name contains this text")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rounds, sample_ns = (9, 2e6) if args.quick else (31, 5e6)

    rows = []
    for case in (c for c in CASES if args.only.lower() in c.name.lower()):
        runs = check(case)
        med = measure(runs, rounds, sample_ns)
        ratio = med["neuron"] / med["cpu"]
        verdict = "-" if case.target is None else ("PASS" if ratio <= case.target else "MISS")
        target = "-" if case.target is None else f"<= {case.target:g}x"
        rows.append((case.name, f"{med['cpu']:.1f}", f"{med['neuron']:.1f}", f"{ratio:.2f}x",
                     target, verdict))
        print(f"{case.name:<58} cpu {med['cpu']:>10.1f} us  neuron {med['neuron']:>10.1f} us  "
              f"{ratio:5.2f}x  target {target:<8} {verdict}", flush=True)

    header = ("case", "CPU median (us)", "neuron median (us)", "neuron/CPU", "target", "result")
    print(f"\n{datetime.date.today()}, {platform.machine()}, torch {torch.__version__}, "
          f"torchneuron {torchneuron.__version__}, {torch.get_num_threads()} thread(s)"
          f"{', --quick' if args.quick else ''}\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
