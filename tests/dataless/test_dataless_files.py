"""A dataless run writes no file holding placeholders: torch.save and DCP saves of values it
never computed leave the disk as it was, are listed with their size, and a DCP load plans
against the checkpoint's metadata (on disk, or saved earlier in the run) without reading data."""

from __future__ import annotations

import gc
import hashlib
import io
import os
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

import torchneuron
from torchneuron.device import dataless, dataless_files
from torchneuron.testing import run_python


@pytest.fixture(autouse=True)
def collect_cycles():
    """DCP's planners leave reference cycles holding device tensors: free them here, not in
    a later test that counts the device's memory."""
    yield
    gc.collect()


def digest(directory) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.Linear(16, 4)).to("neuron")


def test_torch_save_of_dataless_tensors_leaves_the_real_file_and_reports_its_size(tmp_path):
    path = tmp_path / "model.pt"
    real = model()
    torch.save(real.state_dict(), path)
    before = path.read_bytes()
    dataless.reset()
    with torchneuron.dataless():
        planned = model()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(2):  # one warning per call site
                torch.save(planned.state_dict(), path)
    assert path.read_bytes() == before
    (write,) = dataless_files.skipped_writes()
    assert (write.what, write.path, write.calls) == ("torch.save", str(path), 2)
    assert write.site.startswith(f"{__file__}:")
    # The bytes torch.save would have written: the same tensors' serialization, up to zip padding.
    assert abs(write.bytes - len(before)) <= 0.05 * len(before)
    assert [str(w.message) for w in caught if "wrote nothing" in str(w.message)][0].startswith(
        f"torch.save({str(path)!r}) in a dataless run wrote nothing")
    assert sum("wrote nothing" in str(w.message) for w in caught) == 1
    assert not any(r.what == "copy to the host" for r in dataless.reads())  # listed as the save
    report = " ".join(torchneuron.metrics.report().split())
    assert "saves not written" in report and f"{write.bytes:,}" in report
    assert torch.equal(torch.load(path)["0.weight"].cpu(), real.state_dict()["0.weight"].cpu())


def test_saves_of_values_and_into_memory_are_written_as_usual(tmp_path):
    values = {"step": 3, "lr": torch.tensor([0.5]), "on_device": torch.ones(2, device="neuron")}
    dataless.reset()
    with torchneuron.dataless():
        torch.save(values, tmp_path / "state.pt")  # every tensor holds values: written
        buffer = io.BytesIO()
        torch.save(model().state_dict(), buffer)  # in memory: no file to spoil
    loaded = torch.load(tmp_path / "state.pt")
    assert loaded["step"] == 3 and torch.equal(loaded["lr"], values["lr"])
    assert torch.equal(loaded["on_device"].cpu(), torch.ones(2))
    assert buffer.tell() > 0 and dataless_files.skipped_writes() == []


def test_a_dcp_save_writes_nothing_and_a_load_plans_against_the_checkpoint(tmp_path):
    existing = tmp_path / "existing"
    dcp.save(model().state_dict(), checkpoint_id=existing)  # a real checkpoint
    before = digest(existing)
    new = tmp_path / "new"
    dataless.reset()
    with torchneuron.dataless(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        planned = model()
        dcp.save(planned.state_dict(), checkpoint_id=existing)
        dcp.save(planned.state_dict(), checkpoint_id=new)
        state = planned.state_dict()
        dcp.load(state, checkpoint_id=existing)  # the real metadata
        dcp.load(state, checkpoint_id=new)  # the metadata this run kept
        wrong = torch.nn.Linear(32, 8).to("neuron").state_dict()
        with pytest.raises(CheckpointException) as failed:  # as the real load fails
            dcp.load({"0.weight": wrong["weight"]}, checkpoint_id=existing)
        assert "Size mismatch" in str(failed.value.failures[0])
    assert digest(existing) == before
    assert not new.exists()
    saves = {w.path: w for w in dataless_files.skipped_writes()}
    assert set(saves) == {os.fspath(existing), os.fspath(new)}
    tensor_bytes = sum(t.numel() * t.element_size() for t in state.values())
    assert all(w.what == "dcp.save" and w.bytes >= tensor_bytes for w in saves.values())
    # Out of dataless execution the same writer classes write real files again.
    again = tmp_path / "again"
    real = model()
    dcp.save(real.state_dict(), checkpoint_id=again)
    restored = model().state_dict()
    dcp.load(restored, checkpoint_id=again)
    assert all(torch.equal(restored[k].cpu(), v.cpu()) for k, v in real.state_dict().items())


def test_dcp_imported_during_a_dataless_run_is_guarded_too(tmp_path):
    # The guard does not import DCP itself (importing it changes what FSDP registers), so a
    # script that imports it only after TORCHNEURON_DATALESS=1 took effect is covered on import.
    target = tmp_path / "ckpt"
    done = run_python(f"""
        import sys, warnings
        import torch, torchneuron
        assert "torch.distributed.checkpoint" not in sys.modules
        warnings.simplefilter("ignore")
        import torch.distributed.checkpoint as dcp
        dcp.save(torch.nn.Linear(8, 8).to("neuron").state_dict(), checkpoint_id={str(target)!r})
        from torchneuron.device import dataless_files
        print([w.what for w in dataless_files.skipped_writes()])
    """, env={"TORCHNEURON_DATALESS": "1"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['dcp.save']" and not target.exists()
