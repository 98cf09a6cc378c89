"""The C kernels of csrc/kernels.c, built with the package as nvllm.model._kernels and called through
ctypes; `lib` is None where no C compiler was at hand when nvllm was installed, and the NumPy paths in
attention.py and decoder.py are used instead. Each function here has such a NumPy twin, which the tests
hold it to.

NVLLM_KERNELS=0 in the environment turns the kernels off (to compare, or to rule them out).
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import os
from pathlib import Path

import numpy as np

_I64 = ctypes.c_int64
_P = ctypes.c_void_p


def _load() -> ctypes.CDLL | None:
    if os.environ.get("NVLLM_KERNELS", "1") == "0":
        return None
    here = Path(__file__).parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = here / f"_kernels{suffix}"
        if path.exists():
            lib = ctypes.CDLL(str(path))
            lib.paged_decode_attention.argtypes = [_P, _P, _P, _P, _I64, _P, _P, _I64, _I64, _I64, _I64, _I64]
            lib.paged_decode_attention.restype = ctypes.c_int
            lib.softmax_causal_rows.argtypes = [_P, _I64, _I64, _P, _I64, _P]
            lib.softmax_causal_rows.restype = None
            lib.silu_mul.argtypes = [_P, _P, _I64, _I64]
            lib.silu_mul.restype = None
            lib.rms_norm.argtypes = [_P, _P, _P, _I64, _I64, ctypes.c_float]
            lib.rms_norm.restype = None
            lib.rope.argtypes = [_P, _I64, _I64, _I64, _I64, _I64, _P, _P, ctypes.c_float]
            lib.rope.restype = None
            return lib
    return None


lib = _load()


def describe() -> str:
    """One line for logs and the bench: which code runs attention, norms, rope and SwiGLU."""
    if lib is not None:
        return "C kernels"
    if os.environ.get("NVLLM_KERNELS", "1") == "0":
        return "NumPy paths (C kernels turned off by NVLLM_KERNELS=0)"
    return "NumPy paths (C kernels not built: no C compiler when nvllm was installed; slower)"


def _ptr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def _check(a: np.ndarray, dtype: type, name: str) -> None:
    # The kernels index raw memory: a wrong dtype or a strided view would read garbage, not fail.
    if a.dtype != dtype or not a.flags.c_contiguous:
        raise ValueError(f"{name}: need a C-contiguous {np.dtype(dtype).name} array, got {a.dtype} "
                         f"{'contiguous' if a.flags.c_contiguous else 'strided'}")


def paged_decode_attention(q: np.ndarray, k_pool: np.ndarray, v_pool: np.ndarray, block_tables: np.ndarray,
                           context_lens: np.ndarray, out: np.ndarray) -> None:
    """q [S, nh, hd] scaled, pools [NB, bs, nkv, hd], block_tables [S, MB] int32, context_lens [S] int64
    -> out [S, nh, hd]; one query token per sequence."""
    for a, dt, name in ((q, np.float32, "q"), (k_pool, np.float32, "k_pool"), (v_pool, np.float32, "v_pool"),
                        (block_tables, np.int32, "block_tables"), (context_lens, np.int64, "context_lens"),
                        (out, np.float32, "out")):
        _check(a, dt, name)
    S, nh, hd = q.shape
    nb, bs, nkv, _ = k_pool.shape
    if context_lens.size and (context_lens.min() < 1 or context_lens.max() > block_tables.shape[1] * bs):
        raise ValueError("context_lens: each must be at least 1 and fit the block table")
    rc = lib.paged_decode_attention(_ptr(q), _ptr(k_pool), _ptr(v_pool), _ptr(block_tables),
                                    block_tables.shape[1], _ptr(context_lens), _ptr(out), S, nh, nkv, hd, bs)
    if rc != 0:
        raise MemoryError("paged_decode_attention: could not allocate its scratch")


def softmax_causal_rows(scores: np.ndarray, limits: np.ndarray) -> np.ndarray:
    """scores [..., R, W] in place: row r becomes exp(x - max) over keys [0, limits[r]) and 0 past it, where
    limits [R] int64 repeats over the leading axes; returns the row sums [..., R, 1]."""
    _check(scores, np.float32, "scores")
    _check(limits, np.int64, "limits")
    width = scores.shape[-1]
    rows = scores.size // width
    sums = np.empty(scores.shape[:-1] + (1,), dtype=np.float32)
    lib.softmax_causal_rows(_ptr(scores), rows, width, _ptr(limits), limits.size, _ptr(sums))
    return sums


def silu_mul(gate_up: np.ndarray) -> np.ndarray:
    """gate_up [T, 2I] -> silu(gate) * up [T, I]."""
    _check(gate_up, np.float32, "gate_up")
    T, two_i = gate_up.shape
    out = np.empty((T, two_i // 2), dtype=np.float32)
    lib.silu_mul(_ptr(gate_up), _ptr(out), T, two_i // 2)
    return out


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x [T, H] -> x / sqrt(mean(x^2) + eps) * weight."""
    _check(x, np.float32, "x")
    _check(weight, np.float32, "weight")
    out = np.empty_like(x)
    lib.rms_norm(_ptr(x), _ptr(weight), _ptr(out), x.shape[0], x.shape[1], eps)
    return out


def rope(qkv: np.ndarray, num_q_heads: int, num_k_heads: int, head_dim: int, cos: np.ndarray, sin: np.ndarray,
         q_scale: float) -> None:
    """Rotate, in place, the first num_q_heads + num_k_heads heads of each row of qkv [T, width]; cos and sin
    [T, head_dim/2]; query heads are also scaled by q_scale."""
    _check(qkv, np.float32, "qkv")
    _check(cos, np.float32, "cos")
    _check(sin, np.float32, "sin")
    if qkv.shape[1] < (num_q_heads + num_k_heads) * head_dim or cos.shape != (qkv.shape[0], head_dim // 2):
        raise ValueError("rope: qkv and cos/sin shapes do not match the heads")
    lib.rope(_ptr(qkv), qkv.shape[0], qkv.shape[1], num_q_heads, num_k_heads, head_dim, _ptr(cos), _ptr(sin),
             q_scale)
