"""The C kernels (daemon/nvllm/model/csrc/kernels.c); everything else is declared in pyproject.toml.

The extension is optional: where no C compiler is found the install still succeeds and nvllm runs its
NumPy paths instead (nvllm.model.kernels.lib is None, and `nvllm serve` says so in its log).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "nvllm.model._kernels",
            sources=["daemon/nvllm/model/csrc/kernels.c"],
            # No Python API is used: the library is loaded with ctypes, so it needs no Python headers.
            # -ffinite-math-only and -fno-trapping-math let the exp's clamp and the reductions vectorise;
            # the kernels never rely on inf or NaN.
            extra_compile_args=["-O3", "-std=c99", "-fopenmp-simd", "-fno-math-errno", "-fno-trapping-math",
                                "-ffinite-math-only"],
            optional=True,
        )
    ],
)
