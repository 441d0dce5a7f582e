"""The suite compiles into a temporary cache, never the user's (tests/conftest.py)."""

import os
from pathlib import Path

from torchneuron.compiler import cache


def test_compile_cache_and_key_are_outside_the_users_home_directories():
    home = Path.home().resolve()
    for path in (cache.cache_dir(), cache.key_file()):
        resolved = Path(path).resolve()
        assert not resolved.is_relative_to(home / ".cache"), resolved
        assert not resolved.is_relative_to(home / ".config"), resolved
    assert os.environ["NEURON_COMPILE_CACHE_URL"]
