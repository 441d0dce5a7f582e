"""LOCAL_RANK chooses the rank's neuron device (read through torchneuron.config)."""

import pytest
import torch

from torchneuron import config
from torchneuron.distributed import local_device


def test_local_rank_picks_its_device():
    with config.override(LOCAL_RANK="1"):
        assert local_device() == torch.device("neuron", 1)
    with config.override(LOCAL_RANK=None):
        assert local_device() is None


def test_local_rank_without_a_device_is_a_clear_error():
    count = torch.neuron.device_count()
    with config.override(LOCAL_RANK=str(count)), pytest.raises(ValueError, match="NEURON_RT_VISIBLE_CORES=\\$LOCAL_RANK"):
        local_device()
    with config.override(LOCAL_RANK="one"), pytest.raises(ValueError, match="LOCAL_RANK='one'"):
        local_device()
