"""What every collective call re-reads is cached, and a changed setting still takes effect."""

from __future__ import annotations

from torchneuron import config
from torchneuron.distributed import charging, flight_recorder


def test_a_group_is_placed_once_per_topology(monkeypatch):
    placed = []
    place = charging.placement_of
    monkeypatch.setattr(charging, "placement_of", lambda *a: placed.append(a) or place(*a))
    monkeypatch.setattr(charging, "_links", {})
    topology = config.device_topology()
    first, placement, _ = charging._link((0, 1, 2, 3), 4, topology)
    again = charging._link((0, 1, 2, 3), 4, config.device_topology())
    assert again[0] is first and again[1] is placement
    assert len(placed) == 1  # the next collectives of the group reuse its link
    charging._link((0, 1), 4, topology)  # another group (or a send/recv pair): placed
    assert len(placed) == 2
    with config.override(TORCHNEURON_INSTANCE="trn2u.48xlarge"):  # a new topology: placed again
        ultra, _, _ = charging._link(tuple(range(256)), 64, config.device_topology())
    assert len(placed) == 3 and ultra.name == "NeuronLink-v3 (UltraServer)"
    assert charging._link(tuple(range(256)), 64, config.device_topology())[0].name == "EFA"  # trn2.48xlarge again


def test_the_trace_size_is_parsed_when_its_text_changes(monkeypatch):
    """config keeps each setting parsed per text: every collective reads the flight recorder's
    size, and a changed value still applies at the next one."""
    import dataclasses

    name = "TORCHNEURON_COLLECTIVE_TRACE_SIZE"
    parsed = []
    var = config.ENV_VARS[name]
    monkeypatch.setitem(config.ENV_VARS, name, dataclasses.replace(
        var, parse=lambda n, raw: parsed.append(raw) or var.parse(n, raw)))
    monkeypatch.setattr(config, "_parsed", {})
    fields = dict(group="0", seq=1, op="all_reduce", peer=None, input_shapes=[[4]], output_shapes=[[4]],
                  dtypes=["float32"], nbytes=16, async_op=False)
    try:
        flight_recorder.record(fields, rank=0)
        flight_recorder.record(fields, rank=0)
        assert parsed == ["256"]  # the default's text, parsed once
        monkeypatch.setenv(name, "3")
        for _ in range(5):
            flight_recorder.record(fields, rank=0)
        assert len(flight_recorder.entries()) == 3  # the new size applies
        assert parsed == ["256", "3"]
    finally:
        monkeypatch.delenv(name, raising=False)
        flight_recorder.record(fields, rank=0)  # back to the default ring
        flight_recorder.clear()
