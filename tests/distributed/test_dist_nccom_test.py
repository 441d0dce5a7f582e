"""``torchneuron nccom-test``: N local ranks, nccom-test's columns, modelled time from the model."""

from __future__ import annotations

import pytest

from torchneuron.cli import main


def _rows(out: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]


def test_nccom_test_prints_measured_and_modelled_columns(capsys):
    from torchneuron.hardware import resolve_topology
    from torchneuron.hardware.collectives import GroupPlacement, collective_cost, link_for

    assert main(["nccom-test", "allg", "-r", "2", "-b", "1K", "-e", "4K", "-n", "1", "-w", "0"]) == 0
    out = capsys.readouterr().out
    assert "# nccom-test allg on 2 ranks, fp32" in out
    rows = _rows(out)
    assert [int(r[0]) for r in rows] == [1024, 2048, 4096]
    topology = resolve_topology()  # both ranks on one chip of the default target
    placement = GroupPlacement.of([(0, 0), (0, 0)])
    link = link_for(topology.chip, placement, topology.devices[0].dma_bytes_per_second)
    for row in rows:
        nbytes, count = int(row[0]), int(row[1])
        assert count == nbytes // 4 and row[2] == "fp32"
        model_us, algbw, busbw = float(row[8]), float(row[9]), float(row[10])
        expected = collective_cost("all_gather", nbytes, 2, link, placement=placement)
        assert row[11] == expected.algorithm == "mesh"  # below 1 MB: the runtime runs Mesh
        assert model_us == pytest.approx(expected.seconds * 1e6, abs=0.01)
        assert algbw == pytest.approx(expected.algbw / 1e9, rel=1e-2, abs=1e-3)
        assert busbw == pytest.approx(algbw * 0.5, abs=1e-3)  # all-gather: (n-1)/n


def test_nccom_test_refuses_one_rank(capsys):
    assert main(["nccom-test", "allr", "-r", "1"]) == 2
    assert "error: --nworkers 1: a collective needs at least 2 ranks" in capsys.readouterr().out
