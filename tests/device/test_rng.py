"""Random numbers on neuron: per-device generators seeded like the CPU's."""

import pytest
import torch

from conftest import on_device


pytestmark = pytest.mark.usefixtures("restore_rng")


@pytest.mark.parametrize("fn", [
    lambda **kw: torch.randn(5, 3, **kw),
    lambda **kw: torch.rand(7, **kw),
    lambda **kw: torch.randint(0, 100, (9,), **kw),
    lambda **kw: torch.randperm(20, **kw),
    lambda **kw: torch.empty(6, **kw).normal_(2.0, 3.0),
    lambda **kw: torch.empty(6, **kw).uniform_(-1, 1),
    lambda **kw: torch.empty(6, **kw).bernoulli_(0.3),
    lambda **kw: torch.empty(6, **kw).exponential_(),
    lambda **kw: torch.multinomial(torch.ones(10, **kw), 5),
])
def test_manual_seed_gives_cpu_random_stream(fn):
    torch.manual_seed(1234)
    expected = fn(device="cpu")
    torch.manual_seed(1234)
    got = fn(device="neuron")
    assert got.device.type == "neuron" and on_device(got)
    assert torch.equal(got.cpu(), expected)


def test_manual_seed_seeds_every_device():
    torch.manual_seed(7)
    results = [torch.randn(4, device=f"neuron:{i}") for i in range(torch.neuron.device_count())]
    torch.manual_seed(7)
    expected = torch.randn(4)
    for i, r in enumerate(results):
        assert r.device.index == i
        assert torch.equal(r.cpu(), expected)


def test_per_device_generators_are_independent():
    torch.neuron.manual_seed_all(3)
    a0 = torch.randn(4, device="neuron:0")
    a1 = torch.randn(4, device="neuron:1")  # device 1 not advanced by device 0's draw
    assert torch.equal(a0.cpu(), a1.cpu())
    torch.neuron.manual_seed_all(3)
    torch.neuron.set_device(1)
    torch.neuron.manual_seed(99)  # current device only
    assert torch.neuron.initial_seed() == 99
    torch.neuron.set_device(0)
    assert torch.neuron.initial_seed() == 3
    assert torch.equal(torch.randn(4, device="neuron:0").cpu(), a0.cpu())
    gens = torch.neuron.default_generators
    assert len(gens) == torch.neuron.device_count()
    assert [g.device for g in gens] == [torch.device("neuron", i) for i in range(len(gens))]


def test_generator_object_on_neuron():
    g = torch.Generator(device="neuron")
    assert g.device.type == "neuron"
    g.manual_seed(42)
    got = torch.randn(8, device="neuron", generator=g)
    expected = torch.randn(8, generator=torch.Generator().manual_seed(42))
    assert torch.equal(got.cpu(), expected)
    assert on_device(got)
    g.manual_seed(42)
    again = torch.randn(8, device="neuron", generator=g)
    assert torch.equal(again.cpu(), expected)
    g2 = torch.Generator(device="neuron:2").manual_seed(5)
    t = torch.empty(5, device="neuron:2").uniform_(generator=g2)
    assert torch.equal(t.cpu(), torch.empty(5).uniform_(generator=torch.Generator().manual_seed(5)))


def test_cpu_generator_with_neuron_tensor_raises_like_cuda():
    with pytest.raises(RuntimeError):
        torch.randn(3, device="neuron", generator=torch.Generator())


def test_get_set_rng_state_replays_exactly():
    torch.neuron.manual_seed(11)
    torch.randn(3, device="neuron")
    state = torch.neuron.get_rng_state()
    assert state.device.type == "cpu" and state.dtype == torch.uint8
    first = torch.rand(10, device="neuron").cpu()
    torch.neuron.set_rng_state(state)
    assert torch.equal(torch.rand(10, device="neuron").cpu(), first)
    states = torch.neuron.get_rng_state_all()
    draws = [torch.rand(4, device=f"neuron:{i}").cpu() for i in range(4)]
    torch.neuron.set_rng_state_all(states)
    assert all(torch.equal(torch.rand(4, device=f"neuron:{i}").cpu(), draws[i]) for i in range(4))
    torch.neuron.set_rng_state(states[2], 2)
    assert torch.equal(torch.rand(4, device="neuron:2").cpu(), draws[2])


def test_seed_and_seed_all_are_nondeterministic_and_recorded():
    torch.neuron.seed()
    s1 = torch.neuron.initial_seed()
    torch.neuron.seed()
    s2 = torch.neuron.initial_seed()
    assert s1 != s2
    torch.neuron.seed_all()
    seeds = []
    for i in range(torch.neuron.device_count()):
        with torch.neuron.device(i):
            seeds.append(torch.neuron.initial_seed())
    assert len(set(seeds)) == 1


def test_fork_rng_restores_neuron_state():
    torch.neuron.manual_seed(5)
    expected = torch.randn(4, device="neuron").cpu()
    torch.neuron.manual_seed(5)
    with torch.random.fork_rng(device_type="neuron"):
        torch.randn(100, device="neuron")
    assert torch.equal(torch.randn(4, device="neuron").cpu(), expected)


def test_dropout_reproducible_and_matches_cpu():
    x_c = torch.ones(64, 32)
    x = x_c.to("neuron")
    torch.manual_seed(0)
    a = torch.nn.functional.dropout(x, 0.5, training=True)
    torch.manual_seed(0)
    b = torch.nn.functional.dropout(x, 0.5, training=True)
    torch.manual_seed(0)
    c = torch.nn.functional.dropout(x_c, 0.5, training=True)
    assert on_device(a)
    assert torch.equal(a.cpu(), b.cpu())
    assert torch.equal(a.cpu(), c)
    assert 0 < (a == 0).sum().item() < a.numel()


def test_rand_like_and_randint_like_on_device_index():
    torch.manual_seed(8)
    r = torch.rand_like(torch.empty(5, device="neuron:3"))
    torch.manual_seed(8)
    assert r.device == torch.device("neuron", 3)
    assert torch.equal(r.cpu(), torch.rand(5))


def test_fork_rng_with_explicit_devices():
    torch.neuron.manual_seed_all(6)
    expected = torch.randn(4, device="neuron:2").cpu()
    torch.neuron.manual_seed_all(6)
    with torch.random.fork_rng(devices=[2], device_type="neuron"):
        torch.neuron.manual_seed_all(123)
        torch.randn(50, device="neuron:2")
    assert torch.equal(torch.randn(4, device="neuron:2").cpu(), expected)
