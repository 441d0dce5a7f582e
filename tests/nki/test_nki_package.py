"""The torchneuron.nki package: every import style gives the same modules, and its public names."""

import torchneuron.nki as nki
import torchneuron.nki.typing as nt
from torchneuron.nki import NkiValidationError


# ------------------------------------------------------------------ imports / namespace
def test_import_styles_give_one_module():
    import torchneuron.nki.language as nl_a
    from torchneuron.nki import language as nl_b

    assert nl_a is nl_b is nki.language
    assert nki.typing is nt
    assert nki.NkiValidationError is NkiValidationError
    assert issubclass(NkiValidationError, AssertionError)
    assert callable(nki.jit) and callable(nki.simulate) and callable(nki.simulate_kernel)
    assert nki.Kernel is type(nki.jit(lambda: None))
