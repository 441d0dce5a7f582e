"""Convolutional nets under backend="neuron": layouts agree between eager and compiled code.

A neuron convolution's results are channels_last when its input or weight is (as on CPU
and CUDA), and FakeTensor predicts exactly that for neuron tensors: compiled graphs plan
their buffers from the prediction and Inductor checks every extern kernel's strides
against it, so a disagreement fails at run time. The nets are built here (ResNet-18/50
basic and bottleneck blocks, MobileNet depthwise-separable blocks, Hugging Face's ViT
from a config), small enough to compile quickly.
"""

from __future__ import annotations

import copy
import itertools
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from compile_support import _fresh_compile_state, on_neuron  # noqa: F401
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.testing import assert_close

CL = {4: torch.channels_last, 5: torch.channels_last_3d}


# ---- eager strides == FakeTensor's prediction, for every layout ------------------------

def layout(t: torch.Tensor, channels_last: bool) -> torch.Tensor:
    """``t`` channels_last (2-d/3-d), or for 1-d tensors the (N, C, L) view of an (N, L, C) tensor."""
    if not channels_last:
        return t.contiguous()
    if t.dim() == 3:
        return t.transpose(1, 2).contiguous().transpose(1, 2)
    return t.contiguous(memory_format=CL[t.dim()])


# (spatial dims, transposed, groups): plain, grouped and depthwise, forward and transposed.
CONV_CASES = [(d, tr, g) for d in (1, 2, 3) for tr in (False, True) for g in (1, 2, 4)]
LAYOUTS = list(itertools.product((False, True), repeat=2))  # (input, weight) channels_last


def conv_args(dims: int, transposed: bool, groups: int, x_cl: bool, w_cl: bool, device: str):
    torch.manual_seed(0)
    size = (5, 6, 4)[:dims]
    x = torch.randn(2, 4, *size)
    w = torch.randn(*((4, 8 // groups) if transposed else (8, 4 // groups)), *(3,) * dims)
    b = torch.randn(8)
    stride = [2] * dims if transposed else [1] * dims
    params = (stride, [1] * dims, [1] * dims, transposed, [1 if transposed else 0] * dims, groups)
    return layout(x, x_cl).to(device), layout(w, w_cl).to(device), b.to(device), params


def strides(t: torch.Tensor) -> tuple[int | None, ...]:
    """``t``'s strides, None for size-1 dimensions (Inductor's stride check skips those too)."""
    return tuple(s if n != 1 else None for n, s in zip(t.shape, t.stride()))


def fake_run(fn, *tensors):
    with FakeTensorMode() as mode:
        return fn(*(mode.from_tensor(t) for t in tensors))


@pytest.mark.parametrize("x_cl,w_cl", LAYOUTS, ids=lambda v: "cl" if v else "contig")
@pytest.mark.parametrize("dims,transposed,groups", CONV_CASES,
                         ids=[f"{d}d-{'t' if t else 'f'}-g{g}" for d, t, g in CONV_CASES])
def test_conv_strides_match_fake_tensor(dims, transposed, groups, x_cl, w_cl):
    x, w, b, params = conv_args(dims, transposed, groups, x_cl, w_cl, "neuron")
    out = torch.ops.aten.convolution(x, w, b, *params)
    assert on_neuron(out)
    assert strides(out) == strides(fake_run(lambda *t: torch.ops.aten.convolution(*t, *params), x, w, b))
    cx, cw, cb, _ = conv_args(dims, transposed, groups, x_cl, w_cl, "cpu")
    cpu_out = torch.ops.aten.convolution(cx, cw, cb, *params)
    assert torch.equal(out.cpu(), cpu_out)
    # CPU's layout (oneDNN's rule) for float32: channels_last in, channels_last out.
    assert strides(out) == strides(cpu_out)
    for go_cl in (False, True):
        go = layout(torch.randn(out.shape), go_cl).to("neuron")

        def backward(go, x, w):
            return torch.ops.aten.convolution_backward(go, x, w, [8], *params, [True, True, True])

        grads = backward(go, x, w)
        predicted = fake_run(backward, go, x, w)
        cpu_grads = backward(go.cpu(), cx, cw)
        for g, p, c in zip(grads, predicted, cpu_grads):
            assert on_neuron(g)
            assert strides(g) == strides(p)
            assert torch.equal(g.cpu(), c)


def test_fake_tensor_of_cpu_conv_unchanged():
    """The neuron rule passes CPU tensors on to PyTorch's own prediction."""
    x, w, b, params = conv_args(2, False, 1, True, False, "cpu")
    predicted = fake_run(lambda *t: torch.ops.aten.convolution(*t, *params), x, w, b)
    assert strides(predicted) == strides(torch.ops.aten.convolution(x, w, b, *params))


def test_double_and_3d_follow_the_rule():
    """Where CPU's own kernel picks contiguous (float64 3-d convolution), neuron still gives
    channels_last_3d, as it predicts; the values are CPU's."""
    x = torch.randn(1, 2, 4, 4, 4, dtype=torch.float64).contiguous(memory_format=torch.channels_last_3d)
    w = torch.randn(3, 2, 3, 3, 3, dtype=torch.float64)
    out = F.conv3d(x.to("neuron"), w.to("neuron"))
    assert out.is_contiguous(memory_format=torch.channels_last_3d)
    assert strides(out) == strides(fake_run(F.conv3d, x.to("neuron"), w.to("neuron")))
    assert torch.equal(out.cpu(), F.conv3d(x, w))


def test_compile_cache_key_covers_the_layout_rule():
    """Entries compiled under another convolution layout rule must not be reused."""
    from torchneuron.compiler import cache
    from torchneuron.device import fake_conv

    assert Path(fake_conv.__file__) in cache.fingerprinted_sources()


# ---- nets ------------------------------------------------------------------------------

def conv_bn(cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False),
            nn.BatchNorm2d(cout)]


class Residual(nn.Module):
    """ResNet-18's basic block (expansion 1) or ResNet-50's bottleneck (expansion 4)."""

    def __init__(self, cin: int, width: int, stride: int, bottleneck: bool):
        super().__init__()
        cout = width * (4 if bottleneck else 1)
        if bottleneck:
            layers = [*conv_bn(cin, width, 1), nn.ReLU(), *conv_bn(width, width, 3, stride),
                      nn.ReLU(), *conv_bn(width, cout, 1)]
        else:
            layers = [*conv_bn(cin, width, 3, stride), nn.ReLU(), *conv_bn(width, cout, 3)]
        self.body = nn.Sequential(*layers)
        self.downsample = (nn.Sequential(*conv_bn(cin, cout, 1, stride))
                           if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x):
        return F.relu(self.body(x) + self.downsample(x))


def resnet(bottleneck: bool) -> nn.Module:
    expansion = 4 if bottleneck else 1
    return nn.Sequential(
        *conv_bn(3, 8, 3), nn.ReLU(), nn.MaxPool2d(3, 2, 1),
        Residual(8, 8, 1, bottleneck), Residual(8 * expansion, 16, 2, bottleneck),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16 * expansion, 10))


def mobilenet() -> nn.Module:
    def separable(cin, cout, stride):
        return [*conv_bn(cin, cin, 3, stride, groups=cin), nn.ReLU6(), *conv_bn(cin, cout, 1), nn.ReLU6()]

    return nn.Sequential(*conv_bn(3, 8, 3, 2), nn.ReLU6(), *separable(8, 16, 1), *separable(16, 24, 2),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(24, 10))


NETS = {"resnet18": lambda: resnet(False), "resnet50": lambda: resnet(True), "mobilenet": mobilenet}
TOL = dict(rtol=1e-4, atol=1e-5)


def run(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, device: str,
        channels_last: bool, compiled: bool, train: bool, steps: int = 3):
    """Losses, logits and gradients of ``steps`` SGD steps (eval: ``steps`` forward passes)."""
    model = copy.deepcopy(model).to(device)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    model = model.to(memory_format=fmt).train(train)
    images = images.to(device).contiguous(memory_format=fmt)
    labels = labels.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    forward = torch.compile(model, backend="neuron") if compiled else model
    results = []
    for _ in range(steps):
        with torch.set_grad_enabled(train):
            logits = forward(images)
            loss = F.cross_entropy(logits, labels)
        if device == "neuron":
            assert on_neuron(logits)
        step = [loss.detach().cpu(), logits.detach().cpu()]
        if train:
            loss.backward()
            step += [p.grad.cpu() for p in model.parameters()]
            optimizer.step()
            optimizer.zero_grad()
        results.append(step)
    return results, model


def assert_steps_close(actual, expected, **tol):
    for step_a, step_e in zip(actual, expected, strict=True):
        for a, e in zip(step_a, step_e, strict=True):
            assert_close(a, e, **tol)


def check_net(name: str, channels_last: bool, train: bool) -> None:
    torch.manual_seed(0)
    model = NETS[name]()
    images, labels = torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))
    eager, eager_model = run(model, images, labels, "neuron", channels_last, False, train)
    cpu, cpu_model = run(model, images, labels, "cpu", channels_last, False, train)
    assert_steps_close(eager, cpu, rtol=0, atol=0)  # neuron runs CPU's kernels: bit for bit
    for p, c in zip(eager_model.state_dict().values(), cpu_model.state_dict().values()):
        assert p.stride() == c.stride()
    compiled, compiled_model = run(model, images, labels, "neuron", channels_last, True, train)
    assert_steps_close(compiled, eager, **TOL)
    for p, c in zip(compiled_model.state_dict().values(), eager_model.state_dict().values()):
        assert_close(p.cpu(), c.cpu(), **TOL)
    metrics = torch.neuron.compile_metrics()
    assert metrics["graph_breaks"] == 0 and metrics["recompiles"] == 0
    assert metrics["compiles"] == (2 if train else 1)


# The default run keeps one case per net family and mode that fails without the layout
# rule (about a minute and a half of compiling); the rest are marked slow.
slow = pytest.mark.slow
NET_CASES = [
    pytest.param("resnet18", True, True, id="resnet18-channels_last-train"),
    pytest.param("mobilenet", True, True, id="mobilenet-channels_last-train"),
    pytest.param("mobilenet", True, False, id="mobilenet-channels_last-eval"),
    pytest.param("resnet18", False, True, id="resnet18-contiguous-train", marks=slow),
    pytest.param("resnet18", True, False, id="resnet18-channels_last-eval", marks=slow),
    pytest.param("resnet18", False, False, id="resnet18-contiguous-eval", marks=slow),
    pytest.param("mobilenet", False, True, id="mobilenet-contiguous-train", marks=slow),
    pytest.param("mobilenet", False, False, id="mobilenet-contiguous-eval", marks=slow),
    *(pytest.param("resnet50", cl, train, marks=slow,
                   id=f"resnet50-{'channels_last' if cl else 'contiguous'}-{'train' if train else 'eval'}")
      for cl in (True, False) for train in (True, False)),
]


@pytest.mark.parametrize("name,channels_last,train", NET_CASES)
def test_convnet_compiled_as_eager(name, channels_last, train):
    check_net(name, channels_last, train)


# ---- Hugging Face ViT (a patch-embedding convolution) ----------------------------------

def vit():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32,
                                 num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                 num_labels=5, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                 # set, as the first forward would set it (a recompile otherwise)
                                 problem_type="single_label_classification")
    return transformers.ViTForImageClassification(cfg), torch.randn(2, 3, 16, 16), torch.tensor([1, 3])


@pytest.mark.slow
def test_vit_trains_compiled_as_eager():
    model, images, labels = vit()

    def train(compiled: bool, device: str):
        net = copy.deepcopy(model).to(device)
        optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
        forward = torch.compile(net, backend="neuron") if compiled else net
        steps = []
        for _ in range(3):
            out = forward(pixel_values=images.to(device), labels=labels.to(device))
            out.loss.backward()
            steps.append([out.loss.detach().cpu(), out.logits.detach().cpu()]
                         + [p.grad.cpu() for p in net.parameters()])
            optimizer.step()
            optimizer.zero_grad()
        return steps

    eager = train(False, "neuron")
    assert_steps_close(eager, train(False, "cpu"), rtol=0, atol=0)
    assert_steps_close(train(True, "neuron"), eager, **TOL)
    metrics = torch.neuron.compile_metrics()
    assert metrics["graph_breaks"] == 0 and metrics["recompiles"] == 0 and metrics["compiles"] == 2


def test_vit_inference_compiled_as_eager():
    """Inductor lays the patch embedding out channels_last in this graph (its layout
    optimization), so the convolution's strides must be predicted right."""
    model, images, _ = vit()
    model = model.eval().to("neuron")
    with torch.no_grad():
        eager = model(pixel_values=images.to("neuron")).logits
        compiled = torch.compile(model, backend="neuron")(pixel_values=images.to("neuron")).logits
    assert on_neuron(compiled)
    assert_close(compiled.cpu(), eager.cpu(), **TOL)
    assert torch.neuron.compile_metrics()["compiles"] == 1
