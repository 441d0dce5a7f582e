"""Builds torchneuron's C++ core (`torchneuron._C`) against the installed torch."""
import glob
import os

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension, include_paths

here = os.path.dirname(os.path.abspath(__file__))
sources = sorted(glob.glob(os.path.join("torchneuron", "csrc", "**", "*.cpp"), recursive=True))

setup(
    ext_modules=[
        CppExtension(
            "torchneuron._C",
            sources,
            # Kineto's headers (torch/include/kineto) for the PrivateUse1 activity
            # profiler (csrc/accounting/profiler.cpp); torch's CPU wheel is built with Kineto.
            include_dirs=[os.path.join(p, "kineto") for p in include_paths() if p.endswith("include")],
            define_macros=[("USE_KINETO", None)],
            extra_compile_args=["-O2", "-std=c++17", "-Wno-unused-parameter"],
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
