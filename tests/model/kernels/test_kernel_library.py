"""The C kernels' library: built wherever a C compiler is, refused with the fix when it comes from another
version (its ABI), and, turned off by NVLLM_KERNELS=0 or not built, the model runs its NumPy twins (computing
the same) and describe() says why."""

from __future__ import annotations

import importlib.machinery
import os
import shutil

import numpy as np
import pytest

from helpers.kernel_cases import needs_kernels
from nvllm.model.decoder import ForwardBatch, Model
from nvllm.model.kernels import ops as kernels

# All of these also run on emulated aarch64 (deploy/aarch64-check.sh), where the kernels build for NEON.
pytestmark = pytest.mark.aarch64


def test_kernels_are_built_where_a_compiler_is():
    if not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler here, so pip could not build the kernels")
    if os.environ.get("NVLLM_KERNELS") == "0":
        pytest.skip(kernels.describe())
    assert kernels.lib is not None, "a C compiler is present but nvllm/model/kernels/_ops*.so was not built"


@needs_kernels
def test_a_library_from_another_version_is_refused_with_the_fix(monkeypatch):
    before = kernels._why_not
    monkeypatch.setattr(kernels, "ABI", kernels.ABI + 1)
    try:
        assert kernels._load() is None
        assert "reinstall nvllm" in kernels._why_not and "ABI" in kernels._why_not
    finally:
        kernels._why_not = before
    assert kernels.describe() == "C kernels"


def two_steps() -> list[ForwardBatch]:
    """Prompts of 5 and 3 tokens on pages 2 and 0 (pages of 4), then one decode token each."""
    # (token ids, positions, slots, query lens, context lens, block tables, logits indices), as arrays
    prefill = ForwardBatch.build(*map(np.array, ([5, 6, 7, 8, 9, 10, 11, 12], [0, 1, 2, 3, 4, 0, 1, 2],
                                                 [8, 9, 10, 11, 4, 0, 1, 2], [5, 3], [5, 3], [[2, 1], [0, 0]],
                                                 [4, 7])))
    decode = ForwardBatch.build(*map(np.array, ([13, 14], [5, 3], [5, 3], [1, 1], [6, 4], [[2, 1], [0, 0]], [0, 1])))
    return [prefill, decode]


@pytest.mark.parametrize("absent", ["turned off", "not built"])
def test_without_the_library_the_model_runs_its_numpy_twins_and_describe_says_why(tiny, absent, monkeypatch):
    model = Model.from_dir(tiny)
    ref = None
    if kernels.lib is not None:
        cache = model.make_kv_cache(3, 4)
        ref = [model.forward(b, cache) for b in two_steps()]
    monkeypatch.setattr(kernels, "_why_not", kernels._why_not)          # restored afterwards
    if absent == "turned off":
        monkeypatch.setenv("NVLLM_KERNELS", "0")
    else:                                                               # no library file to be found
        monkeypatch.delenv("NVLLM_KERNELS", raising=False)
        monkeypatch.setattr(importlib.machinery, "EXTENSION_SUFFIXES", [".not-built.so"])
    monkeypatch.setattr(kernels, "lib", kernels._load())                # what importing ops.py does
    assert kernels.lib is None
    why = {"turned off": "C kernels turned off by NVLLM_KERNELS=0", "not built": "C kernels not built"}[absent]
    assert kernels.describe().startswith(f"NumPy paths ({why}")

    def no_c(*args, **kwargs):
        raise AssertionError("a C kernel was called on the NumPy path")
    for name in ("PagedDecode", "RopeWriteKV", "softmax_causal_rows", "silu_mul", "rms_norm"):
        monkeypatch.setattr(kernels, name, no_c)
    cache = model.make_kv_cache(3, 4)
    ours = [model.forward(b, cache) for b in two_steps()]
    assert all(o.shape == (2, model.config.vocab_size) and np.isfinite(o).all() for o in ours)
    if ref is not None:                                                 # the twins compute the same
        for o, r in zip(ours, ref):
            np.testing.assert_allclose(o, r, atol=1e-4, rtol=1e-4)
