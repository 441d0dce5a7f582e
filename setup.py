"""Builds torchneuron's C++ core (`torchneuron._C`) against the installed torch."""
import glob
import os

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

here = os.path.dirname(os.path.abspath(__file__))
sources = sorted(glob.glob(os.path.join("torchneuron", "csrc", "*.cpp")))

setup(
    ext_modules=[
        CppExtension(
            "torchneuron._C",
            sources,
            extra_compile_args=["-O2", "-std=c++17", "-Wno-unused-parameter"],
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
