"""The C kernels of the forward pass's other layers (csrc/attention.c: paged decode and prefill attention,
the causal softmax; csrc/ops.c: RMSNorm, SwiGLU, rope with the KV write), built with the package as
nvllm.model.kernels._ops and called through ctypes (prefill attention's wrapper is prefill.py); `lib` is
None where no C compiler was at hand when nvllm was installed, and the NumPy paths in model/attention.py
and model/decoder.py are used instead. Each function here has such a
NumPy twin, which the tests hold it to.

NVLLM_KERNELS=0 in the environment turns the kernels off (to compare, or to rule them out).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from nvllm.model.kernels.library import load_library
from nvllm.model.quant.kv_format import F32, KVFormat, of_pool

_I64 = ctypes.c_int64
_P = ctypes.c_void_p
ABI = 7  # must equal kernels_abi() in csrc/ops.c

_why_not = ""


def _load() -> ctypes.CDLL | None:
    global _why_not
    lib, _why_not = load_library("_ops", "kernels_abi", ABI, "C kernels")
    if lib is not None:
        lib.paged_decode_attention.argtypes = [_P, _I64, _P, _P, _P, _I64, _P, _P, _I64, _I64, _I64, _I64, _I64,
                                               ctypes.c_int, _I64]
        lib.paged_decode_part.argtypes = [_P, ctypes.c_int]
        lib.paged_decode_part.restype = None
        lib.paged_prefill_part.argtypes = [_P, ctypes.c_int]
        lib.encoder_attention_part.argtypes = [_P, ctypes.c_int]
        lib.encoder_attention_part.restype = None
        lib.paged_prefill_part.restype = None
        lib.paged_decode_attention.restype = ctypes.c_int
        lib.softmax_causal_rows.argtypes = [_P, _I64, _I64, _P, _I64, _P, _P]
        lib.softmax_causal_rows.restype = None
        lib.silu_mul.argtypes = [_P, _P, _I64, _I64]
        lib.silu_mul.restype = None
        lib.gelu_tanh_mul.argtypes = [_P, _P, _I64, _I64]
        lib.gelu_tanh_mul.restype = None
        lib.gelu_erf.argtypes = [_P, _I64]
        lib.gelu_erf.restype = None
        lib.rms_norm.argtypes = [_P, _P, _P, _I64, _I64, ctypes.c_float]
        lib.rms_norm.restype = None
        lib.rope_write_kv.argtypes = [_P, _I64, _I64, _I64, _I64, _I64, _P, _P, ctypes.c_float, _P, _P, _P,
                                      ctypes.c_int]
        lib.rope_write_kv.restype = None
    return lib


lib = _load()


def describe() -> str:
    """One line for logs and the bench: which code runs attention, norms, rope and SwiGLU."""
    return "C kernels" if lib is not None else f"NumPy paths ({_why_not})"


def _ptr(a: np.ndarray) -> int:
    # from_buffer is the cheapest way to an address (about 0.8 us against 2 us for .ctypes.data), but
    # only for writable contiguous memory; read-only weights and strided views take the long way.
    if a.flags.writeable and a.flags.c_contiguous and a.size:
        return ctypes.addressof(ctypes.c_char.from_buffer(a))  # type: ignore[arg-type]  # stubs lack ndarray's buffer
    return a.ctypes.data


def _check(a: np.ndarray, dtype: DTypeLike, name: str, ndim: int | None = None, written: bool = False) -> None:
    # The kernels index raw memory: a wrong dtype, rank or a strided view would read garbage, not fail.
    if not isinstance(a, np.ndarray):
        raise ValueError(f"{name}: need a NumPy array, got {type(a).__name__}")
    if a.dtype != dtype or not a.flags.c_contiguous:
        raise ValueError(f"{name}: need a C-contiguous {np.dtype(dtype).name} array, got {a.dtype} "
                         f"{'contiguous' if a.flags.c_contiguous else 'strided'}")
    if ndim is not None and a.ndim != ndim:
        raise ValueError(f"{name}: need {ndim} dimensions, got shape {list(a.shape)}")
    if written and not a.flags.writeable:
        raise ValueError(f"{name}: is written in place, but is read-only")


def check_pool(kv_pool: np.ndarray, written: bool) -> tuple[int, int, int, int, KVFormat]:
    """kv_pool [2, NB, bs, nkv, hd / per element] in one of kv_format's element types: the kernels take
    V's address one K pool past K's. Returns its sizes (hd in values) and its format."""
    fmt = of_pool(kv_pool) if isinstance(kv_pool, np.ndarray) else F32
    _check(kv_pool, fmt.dtype, "kv_pool", ndim=5, written=written)
    two, nb, bs, nkv, width = kv_pool.shape
    if two != 2 or bs < 1 or nkv < 1 or width < 1:
        raise ValueError(f"kv_pool: need [2 (K, V), blocks, block size >= 1, KV heads >= 1, head size >= 1], "
                         f"got {list(kv_pool.shape)}")
    return nb, bs, nkv, width * fmt.per_element, fmt


def _first(mask: np.ndarray) -> tuple[int, ...]:
    """Index of the first True in mask (which has one), for error messages."""
    return tuple(int(i) for i in np.unravel_index(int(np.argmax(mask)), mask.shape))


def check_tables(tables: np.ndarray, context_lens: np.ndarray, num_blocks: int, block_size: int) -> None:
    """Every block id a kernel will read (the first ceil(context / block_size) of each row of tables)
    inside a pool of num_blocks; the padding past them is never read, so never checked."""
    pages = -(-context_lens // block_size)                         # [S] pages each row reads
    if pages.size and pages.max() > tables.shape[1]:
        r = int(np.argmax(pages > tables.shape[1]))
        raise ValueError(f"context_lens: row {r} has {int(context_lens[r])} tokens, {int(pages[r])} pages of "
                         f"{block_size}, but its block table holds {tables.shape[1]}")
    used = np.arange(tables.shape[1]) < pages[:, None]             # [S, MB]
    bad = used & ((tables < 0) | (tables >= num_blocks))
    if bad.any():
        r, j = _first(bad)
        raise ValueError(f"block_tables: row {r}, page {j} is block {int(tables[r, j])}, outside the "
                         f"pool's [0, {num_blocks})")


def check_q_out(q: np.ndarray, out: np.ndarray, rows: int, nkv: int, hd: int) -> int:
    """An attention kernel's q [rows, nh, hd] (scaled; rows may be strided, heads contiguous) and out
    [rows, nh, hd], nh a multiple of the pool's nkv; returns nh (out's)."""
    _check(out, np.float32, "out", ndim=3, written=True)
    nh = out.shape[1]
    if (not isinstance(q, np.ndarray) or q.dtype != np.float32 or q.shape != (rows, nh, hd)
            or q.strides[1:] != (4 * hd, 4) or q.strides[0] % 4):
        raise ValueError(f"q: need float32 [{rows}, {nh}, {hd}] with contiguous heads, got "
                         f"{getattr(q, 'dtype', type(q).__name__)} {getattr(q, 'shape', '')}")
    if out.shape != (rows, nh, hd) or nh % nkv:
        raise ValueError(f"out: need [{rows}, {nh}, {hd}] with query heads a multiple of {nkv} KV heads, "
                         f"got {list(out.shape)}")
    return nh


class _DecodeJob(ctypes.Structure):
    """csrc/ops.c's decode_job_t: paged_decode_attention's arguments, and each part's sequences."""
    _fields_ = [("q", _P), ("q_stride", _I64), ("k_pool", _P), ("v_pool", _P), ("block_tables", _P),
                ("table_stride", _I64), ("context_lens", _P), ("out", _P), ("nh", _I64), ("nkv", _I64),
                ("hd", _I64), ("bs", _I64), ("bounds", _P), ("failed", ctypes.c_int), ("fmt", ctypes.c_int),
                ("window", _I64)]


def split_by_work(context_lens: np.ndarray, parts: int) -> np.ndarray:
    """Bounds [parts + 1] cutting the sequences into `parts` contiguous runs of about equal keys to read
    (a sequence's context, plus a few keys' worth for its fixed cost); some runs may be empty."""
    work = np.cumsum(context_lens + 16)
    cuts = np.searchsorted(work, work[-1] * np.arange(1, parts) / parts, side="right")
    return np.concatenate([[0], cuts, [context_lens.size]]).astype(np.int64)


class PagedDecode:
    """Decode attention for one step: one query token per sequence against its pages, read in place.

    The block tables [S, MB] int32 and context lengths [S] int64 are checked, and their addresses
    taken, once; then the object is called layer after layer with that layer's q [S, nh, hd] (scaled;
    rows may be strided, heads contiguous), pool [2, NB, bs, nkv, hd] and out [S, nh, hd]. Every block id
    the kernel will read (the first ceil(context / bs) of each row) is checked against the pool, once
    per pool shape."""

    def __init__(self, block_tables: np.ndarray, context_lens: np.ndarray) -> None:
        _check(block_tables, np.int32, "block_tables", ndim=2)
        _check(context_lens, np.int64, "context_lens", ndim=1)
        if block_tables.shape[0] != context_lens.size:
            raise ValueError(f"block_tables: need one row per sequence ({context_lens.size}), "
                             f"got {block_tables.shape[0]}")
        if context_lens.size and context_lens.min() < 1:
            r = int(np.argmax(context_lens < 1))
            raise ValueError(f"context_lens: each must be at least 1, row {r} is {int(context_lens[r])}")
        self.num_seqs = context_lens.size
        self.max_context = int(context_lens.max()) if context_lens.size else 0
        self._checked: tuple[int, int] | None = None   # (num_blocks, block_size) the tables were checked for
        # Private copies (a few hundred bytes): what was checked is what the kernel reads, whatever the
        # caller does with its arrays later. The addresses below point into these.
        block_tables, context_lens = block_tables.copy(), context_lens.copy()
        self._keep = (block_tables, context_lens)
        self._fixed = (_ptr(block_tables), block_tables.shape[1], _ptr(context_lens))
        self._jobs: dict[int, tuple[_DecodeJob, np.ndarray]] = {}   # by parts: the job and its bounds
        self._bounds: dict[int, np.ndarray] = {}                     # by parts: split_by_work's bounds

    def _check_tables(self, num_blocks: int, block_size: int) -> None:
        check_tables(*self._keep, num_blocks, block_size)
        self._checked = (num_blocks, block_size)

    def bounds(self, parts: int) -> np.ndarray:
        """split_by_work's bounds for `parts` runs of sequences, made once per part count."""
        if parts not in self._bounds:
            self._bounds[parts] = split_by_work(self._keep[1], parts)
        return self._bounds[parts]

    def addresses(self, num_blocks: int, block_size: int) -> tuple[int, int, int]:
        """(block tables, their row stride, context lengths): the checked copies' addresses, for a kernel
        that attends within a pool of num_blocks pages of block_size (kernels/step.py's)."""
        if self._checked != (num_blocks, block_size):
            self._check_tables(num_blocks, block_size)
        return self._fixed

    def __call__(self, q: np.ndarray, kv_pool: np.ndarray, out: np.ndarray, parts: int = 1,
                 team_run: Callable[[int, int, int], None] | None = None, window: int = 0) -> None:
        """With team_run (matmul.team_run) and parts > 1, the sequences are split into `parts` runs
        of about equal work, run on the kernels' thread team: the same bits as one call. window > 0: each
        query sees only its last `window` keys (a sliding-window layer)."""
        nb, bs, nkv, hd, fmt = check_pool(kv_pool, written=False)
        S = self.num_seqs
        nh = check_q_out(q, out, S, nkv, hd)
        tables, width, ctx = self.addresses(nb, bs)
        k = _ptr(kv_pool)
        parts = min(int(parts), S)
        if team_run is None or parts < 2:
            assert lib is not None  # callers run this only with the library loaded
            rc = lib.paged_decode_attention(_ptr(q), q.strides[0] // 4, k, k + kv_pool[0].nbytes, tables, width, ctx,
                                            _ptr(out), S, nh, nkv, hd, bs, fmt.code, max(0, int(window)))
        else:
            if parts not in self._jobs:
                bounds = self.bounds(parts)
                job = _DecodeJob(block_tables=tables, table_stride=width, context_lens=ctx, bounds=_ptr(bounds))
                self._jobs[parts] = (job, bounds)
            job = self._jobs[parts][0]
            job.q, job.q_stride, job.out = _ptr(q), q.strides[0] // 4, _ptr(out)
            job.k_pool, job.v_pool = k, k + kv_pool[0].nbytes
            job.nh, job.nkv, job.hd, job.bs, job.failed, job.fmt = nh, nkv, hd, bs, 0, fmt.code
            job.window = max(0, int(window))
            team_run(_PART, ctypes.addressof(job), parts)
            rc = job.failed
        if rc != 0:
            raise MemoryError("paged_decode_attention: could not allocate its scratch")


# paged_decode_part's address (a loaded symbol's is never NULL, so `or 0` only types it)
_PART: int = (ctypes.cast(lib.paged_decode_part, ctypes.c_void_p).value or 0) if lib is not None else 0


def run_parts(run_part: Callable[[int, int], Any], part: int, job: ctypes.Structure, parts: int,
              team_run: Callable[[int, int, int], None] | None, what: str) -> None:
    """A C job split into `parts` parts on the kernels' thread team (team_run with the part function's
    address, `part`), or run whole on this thread (run_part(job, 0)); MemoryError naming `what` when a part
    could not allocate its scratch (the job's `failed`)."""
    if team_run is None or parts < 2:
        run_part(ctypes.addressof(job), 0)
    else:
        team_run(part, ctypes.addressof(job), parts)
    if job.failed:
        raise MemoryError(f"{what}: could not allocate its scratch")


def softmax_causal_rows(scores: np.ndarray, limits: np.ndarray, starts: np.ndarray | None = None) -> np.ndarray:
    """scores [..., R, W] in place: row r becomes exp(x - max) over keys [0, limits[r]) and 0 past it, where
    limits [R] int64 repeats over the leading axes; returns the row sums [..., R, 1]. With starts [R] int64
    (a sliding window's), row r keeps keys [starts[r], limits[r]) only."""
    _check(scores, np.float32, "scores", written=True)
    _check(limits, np.int64, "limits", ndim=1)
    if starts is not None:
        _check(starts, np.int64, "starts", ndim=1)
        if starts.shape != limits.shape or starts.min() < 0 or (starts >= limits).any():
            raise ValueError("starts: need one per limit, each in [0, its limit)")
    if scores.ndim < 2 or scores.shape[-1] < 1:
        raise ValueError(f"scores: need [..., rows, keys] with at least one key, got {list(scores.shape)}")
    width = scores.shape[-1]
    rows = scores.size // width
    if not limits.size or rows % limits.size:
        raise ValueError(f"limits: need one per row, repeating over the leading axes: {limits.size} do not "
                         f"divide {rows} rows")
    if limits.min() < 1 or limits.max() > width:
        r = int(np.argmax((limits < 1) | (limits > width)))
        raise ValueError(f"limits: each must be in [1, {width}], row {r} is {int(limits[r])}")
    sums = np.empty(scores.shape[:-1] + (1,), dtype=np.float32)
    assert lib is not None  # callers run this only with the library loaded
    lib.softmax_causal_rows(_ptr(scores), rows, width, _ptr(limits), limits.size, _ptr(sums),
                            None if starts is None else _ptr(starts))
    return sums


def silu_mul(gate_up: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """gate_up [T, 2I] -> silu(gate) * up [T, I] (into out, if given)."""
    return _gated(gate_up, "silu_mul", out)


def gelu_tanh_mul(gate_up: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """gate_up [T, 2I] -> gelu_pytorch_tanh(gate) * up [T, I] (Gemma's GeGLU; into out, if given)."""
    return _gated(gate_up, "gelu_tanh_mul", out)


def gelu_erf(x: np.ndarray) -> np.ndarray:
    """x (float32, contiguous) in place -> x (1 + erf(x / sqrt 2)) / 2, BERT's GELU."""
    _check(x, np.float32, "x", written=True)
    assert lib is not None  # callers run this only with the library loaded
    lib.gelu_erf(_ptr(x), x.size)
    return x


def _out(out: np.ndarray | None, shape: tuple[int, ...]) -> np.ndarray:
    if out is None:
        return np.empty(shape, np.float32)
    _check(out, np.float32, "out", ndim=len(shape), written=True)
    if out.shape != shape:
        raise ValueError(f"out: need {list(shape)}, got {list(out.shape)}")
    return out


def _gated(gate_up: np.ndarray, kernel: str, out: np.ndarray | None) -> np.ndarray:
    _check(gate_up, np.float32, "gate_up", ndim=2)
    T, two_i = gate_up.shape
    if two_i % 2:
        raise ValueError(f"gate_up: need an even width (gate then up), got {two_i}")
    out = _out(out, (T, two_i // 2))
    assert lib is not None  # callers run this only with the library loaded
    getattr(lib, kernel)(_ptr(gate_up), _ptr(out), T, two_i // 2)
    return out


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float, out: np.ndarray | None = None) -> np.ndarray:
    """x [T, H] -> x / sqrt(mean(x^2) + eps) * weight (into out, if given; out may be x)."""
    _check(x, np.float32, "x", ndim=2)
    _check(weight, np.float32, "weight", ndim=1)
    if weight.shape != (x.shape[1],):
        raise ValueError(f"weight: need [{x.shape[1]}] to match x's rows, got {list(weight.shape)}")
    out = _out(out, x.shape)
    assert lib is not None  # callers run this only with the library loaded
    lib.rms_norm(_ptr(x), _ptr(weight), _ptr(out), x.shape[0], x.shape[1], eps)
    return out


class RopeWriteKV:
    """The step between a layer's qkv projection and its attention, for one step: q and k of every row
    get the rotary embedding (q also the softmax scale) in place, and k and v go to their pool slots.
    cos and sin [T, hd/2] and the slots [T] are checked, and their addresses taken, once per step."""

    def __init__(self, cos: np.ndarray, sin: np.ndarray, slot_mapping: np.ndarray, num_q_heads: int,
                 num_kv_heads: int, head_dim: int, q_scale: float) -> None:
        # Negative head counts would move the kernel's k and v offsets before the row.
        for name, n, least in (("num_q_heads", num_q_heads, 1), ("num_kv_heads", num_kv_heads, 1),
                               ("head_dim", head_dim, 2)):
            if int(n) != n or n < least:
                raise ValueError(f"{name}: need an integer of at least {least}, got {n}")
        if head_dim % 2:
            raise ValueError(f"head_dim: need an even size (rotary pairs), got {head_dim}")
        _check(cos, np.float32, "cos", ndim=2)
        _check(sin, np.float32, "sin", ndim=2)
        _check(slot_mapping, np.int64, "slot_mapping", ndim=1)
        slot_mapping = slot_mapping.copy()      # what is checked is what the kernel reads, as in PagedDecode
        T = slot_mapping.size
        if cos.shape != (T, head_dim // 2) or sin.shape != cos.shape:
            raise ValueError(f"cos, sin: need [{T}, {head_dim // 2}] float32, got {list(cos.shape)} and "
                             f"{list(sin.shape)}")
        if T and slot_mapping.min() < 0:
            t = int(np.argmax(slot_mapping < 0))
            raise ValueError(f"slot_mapping: slots cannot be negative, token {t} has {int(slot_mapping[t])}")
        self._max_slot = int(slot_mapping.max()) if T else -1
        self._heads = (int(num_q_heads), int(num_kv_heads), int(head_dim))
        self._scale = q_scale
        self._keep = (cos, sin, slot_mapping)   # the addresses below point into these
        self._ptrs = (_ptr(cos), _ptr(sin), _ptr(slot_mapping))

    @property
    def heads(self) -> tuple[int, int, int, float]:
        """(q heads, KV heads, head size, q's scale)."""
        return self._heads + (self._scale,)

    def addresses(self, num_slots: int) -> tuple[int, int, int]:
        """(cos, sin, slots): the checked copies' addresses, for a kernel that writes within a pool of
        num_slots slots (kernels/step.py's)."""
        if self._max_slot >= num_slots:
            t = int(np.argmax(self._keep[2] >= num_slots))
            raise ValueError(f"slot_mapping: token {t} has slot {int(self._keep[2][t])}, outside the pool's "
                             f"[0, {num_slots})")
        return self._ptrs

    def __call__(self, qkv: np.ndarray, kv_pool: np.ndarray) -> None:
        """qkv [T, (nq + 2 nkv) hd] float32, contiguous; kv_pool [2, NB, bs, nkv, hd]."""
        _check(qkv, np.float32, "qkv", ndim=2, written=True)
        nb, bs, pool_nkv, pool_hd, fmt = check_pool(kv_pool, written=True)
        nq, nkv, hd = self._heads
        T = self._keep[2].size
        if qkv.shape != (T, (nq + 2 * nkv) * hd):
            raise ValueError(f"qkv: need [{T}, {(nq + 2 * nkv) * hd}], got {list(qkv.shape)}")
        if (pool_nkv, pool_hd) != (nkv, hd):
            raise ValueError(f"kv_pool: need {nkv} KV heads of {hd}, got {pool_nkv} of {pool_hd}")
        cos, sin, slots = self.addresses(nb * bs)
        k = _ptr(kv_pool)
        assert lib is not None  # callers run this only with the library loaded
        lib.rope_write_kv(_ptr(qkv), T, qkv.shape[1], nq, nkv, hd, cos, sin, self._scale, slots, k,
                          k + kv_pool[0].nbytes, fmt.code)
