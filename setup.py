"""The C kernels (daemon/nvllm/model/kernels/csrc/); everything else is declared in pyproject.toml.

The extension is optional: where no C compiler is found the install still succeeds and nvllm runs its
NumPy paths instead (nvllm.model.kernels.ops.lib is None, and `nvllm serve` says so in its log).
"""

from setuptools import Extension, setup

# The integer kernels of the repacked weights (csrc/packed.h): the layout, the dispatch and the portable
# reference, then one file per instruction set, each compiled once with its own target (a file for
# another architecture compiles to nothing).
DOT_SOURCES = ("pack", "dot", "dot_scalar", "dot_avx2", "dot_avx512vnni", "dot_neon", "dot_dotprod")

setup(
    ext_modules=[
        Extension(
            "nvllm.model.kernels._ops",
            sources=["daemon/nvllm/model/kernels/csrc/ops.c", "daemon/nvllm/model/kernels/csrc/attention.c"],
            depends=["daemon/nvllm/model/kernels/csrc/blocks.h", "daemon/nvllm/model/kernels/csrc/ops.h",
                     "daemon/nvllm/model/kernels/csrc/fmath.h", "daemon/nvllm/model/kernels/csrc/kv.h",
                     "daemon/nvllm/model/kernels/csrc/packed.h"],
            # No Python API is used: the library is loaded with ctypes, so it needs no Python headers.
            # -fno-trapping-math lets the selects and reductions vectorise. No -ffinite-math-only: a model
            # that diverges makes NaN and inf, which must then stay NaN and inf, not be undefined behaviour.
            # -g0 over Python's -g: the same code, without the debug information that took a third of the
            # build (the old one-file qdot.c: 99 s -> 66 s here; 18 -> 8 minutes under aarch64 emulation).
            extra_compile_args=["-O3", "-g0", "-std=c99", "-fopenmp-simd", "-fno-math-errno", "-fno-trapping-math"],
            optional=True,
        ),
        Extension(
            "nvllm.model.kernels._matmul",
            # step.c runs a decode step's layers in one call, so ops.c's kernels are built in here too,
            # beside this library's thread team (the _ops library above stays for everything else).
            sources=["daemon/nvllm/model/kernels/csrc/matmul.c", "daemon/nvllm/model/kernels/csrc/ops.c",
                     "daemon/nvllm/model/kernels/csrc/attention.c",
                     "daemon/nvllm/model/kernels/csrc/step.c", "daemon/nvllm/model/kernels/csrc/team.c",
                     # the repacked weights' integer kernels: one file per instruction set (packed.h)
                     *(f"daemon/nvllm/model/kernels/csrc/{name}.c" for name in DOT_SOURCES)],
            # Their shared block layouts and helpers: a change there rebuilds both.
            depends=["daemon/nvllm/model/kernels/csrc/blocks.h", "daemon/nvllm/model/kernels/csrc/ops.h",
                     "daemon/nvllm/model/kernels/csrc/fmath.h", "daemon/nvllm/model/kernels/csrc/kv.h",
                     "daemon/nvllm/model/kernels/csrc/team.h", "daemon/nvllm/model/kernels/csrc/packed.h",
                     "daemon/nvllm/model/kernels/csrc/matmul.h",
                     "daemon/nvllm/model/kernels/csrc/peak.h", "daemon/nvllm/model/kernels/csrc/dot_x86.h",
                     "daemon/nvllm/model/kernels/csrc/dot_arm.h", "daemon/nvllm/model/kernels/csrc/dot_float.h"],
            # The weight-format matmuls: the same flags, and POSIX threads for their team. A second
            # extension so that a failure to build it (no pthreads) leaves the kernels above in place.
            extra_compile_args=["-O3", "-g0", "-std=c99", "-fopenmp-simd", "-fno-math-errno", "-fno-trapping-math",
                                "-pthread"],
            extra_link_args=["-pthread"],
            optional=True,
        ),
    ],
)
