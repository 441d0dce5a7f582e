#!/usr/bin/env bash
# Sets up torchneuron on a fresh machine, and is cheap to run again.
#
# Installs torch 2.13.0 (exact pin: a looser range would pull a multi-GB CUDA
# build), the build, test and runtime dependencies, then builds the C++
# extension with an editable install (~2-3 min on 2 cores). The build is
# skipped when torchneuron/_C*.so is newer than every file in torchneuron/csrc/
# and setup.py, and this checkout's torchneuron imports.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
repo_root="$(pwd)"

python -m pip install -q "torch==2.13.0"
python -m pip install -q "torch==2.13.0" setuptools ninja \
    pytest pytest-timeout expecttest "transformers==5.22.2" "accelerate==1.16.0" \
    numpy rich ml_dtypes matplotlib

# Headless Chromium, only for the one test that opens `torchneuron check`'s HTML report in a
# browser (tests/cli/test_check_cli.py::test_html_report_renders_in_headless_chromium);
# reports never need it (their plots are PNGs made by matplotlib). Best effort, bounded in
# time (no retries, short timeouts: CI may reach no Debian mirror); without it that test is
# skipped, saying why.
install_chromium() {
    local apt_options=(-q -o Acquire::Retries=0 -o Acquire::http::Timeout=20 -o Acquire::https::Timeout=20)
    command -v apt-get >/dev/null 2>&1 && [[ "$(id -u)" == 0 ]] || return 1
    if ! ls /var/lib/apt/lists/*_Packages* >/dev/null 2>&1; then  # a fresh image has no package lists
        apt-get "${apt_options[@]}" update >/dev/null 2>&1 || return 1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get "${apt_options[@]}" install -y --no-install-recommends \
        chromium >/dev/null 2>&1
}
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
    install_chromium || echo "torchneuron: chromium not installed (needs apt-get, root and a Debian" \
        "mirror); the HTML report's browser test will be skipped; reports do not need it"
fi

# True if the built extension is up to date and this checkout is the one imported.
extension_is_fresh() {
    local so
    so="$(ls -t torchneuron/_C*.so 2>/dev/null | head -n 1 || true)"
    [[ -n "$so" ]] || return 1
    if [[ -n "$(find torchneuron/csrc setup.py -type f \( -name '*.cpp' -o -name '*.h' -o -name '*.py' \) -newer "$so" -print -quit)" ]]; then
        return 1
    fi
    # Run from / so the current directory cannot shadow the installed package.
    (cd / && TORCHNEURON_REPO="$repo_root" python - <<'PY' >/dev/null 2>&1
import os
import torch
import torchneuron
import torch_neuronx  # added to the package list later: an older install lacks it
for module in (torchneuron, torch_neuronx):
    here = os.path.dirname(os.path.abspath(module.__file__))
    assert os.path.samefile(here, os.path.join(os.environ["TORCHNEURON_REPO"], module.__name__))
PY
    )
}

if extension_is_fresh; then
    echo "torchneuron: C++ extension up to date, skipping the build"
else
    echo "torchneuron: building the C++ extension (takes 2-3 minutes on 2 cores)"
    # setup.py imports torch; with autoload on, a stale or broken _C*.so would
    # fail that import and block the very build that replaces it.
    TORCH_DEVICE_BACKEND_AUTOLOAD=0 python -m pip install -q --no-build-isolation -e .
fi
python -c "import torch, torchneuron; print(f'torchneuron {torchneuron.__version__} on torch {torch.__version__}: {torch.neuron.device_count()} neuron devices')"
