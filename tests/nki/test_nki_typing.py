"""nki.typing (torchneuron/nki/typing.py): ``nt.tensor[...]`` annotations and the legacy placeholders."""

import ml_dtypes
import numpy as np
import pytest

import torchneuron.nki.language as nl
import torchneuron.nki.typing as nt


# ---------------------------------------------------------------------------- typing
def test_typing_annotations_and_legacy_placeholders():
    t = nt.tensor[128, 512]
    assert t.shape == (128, 512) and t.dtype is None and t.ndim == 2
    legacy = nt.tensor[[8192, 4096], nl.bfloat16]
    assert legacy.shape == (8192, 4096) and legacy.dtype is nl.bfloat16 and legacy.size == 8192 * 4096
    assert nt.tensor[128, 512, nl.float32] == nt.tensor[[128, 512], "float32"]
    small = nt.tensor[[4, 8], nl.bfloat16]
    assert small.numpy().dtype == ml_dtypes.bfloat16 and small.numpy().shape == (4, 8)
    r = small.numpy("random", seed=3)
    assert np.array_equal(r, small.numpy("random", seed=3)) and (r.astype(np.float32) < 1).all()
    small.check(np.zeros((4, 8), ml_dtypes.bfloat16))
    with pytest.raises(TypeError, match="shape"):
        small.check(np.zeros((4, 9), ml_dtypes.bfloat16))
    with pytest.raises(TypeError, match="takes dims then an optional dtype"):
        nt.tensor["x"]
    with pytest.raises(TypeError, match="positive int dims"):
        nt.tensor[128, 0]
    with pytest.raises(TypeError, match="annotation"):
        nt.tensor()

    def annotated(x: nt.tensor[128, 512], y: nt.tensor) -> None:
        pass

    assert annotated.__annotations__["x"].shape == (128, 512)
