"""A step's layers in one call into C (csrc/step.c, in the _matmul library beside the thread team):
norm, q|k|v, bias, q/k norms, rope and the KV write, paged attention, the output projection, norm,
gate|up, SwiGLU and down, layer after layer, with no Python between them; Gemma 3's output norms, GeGLU,
sliding windows and the local layers' rope too. A decode step (one new token per sequence) takes paged
decode attention; a step with prefill chunks (mixed with decode rows or not) takes prefill attention's
tasks over every sequence (kernels/prefill.py), and its products go through x's rows a tile at a time.

Its twin is decoder.py's loop over the layers, which calls the same kernels one by one: step.c runs the
whole step as one team of threads (csrc/team.c), each op split across them, every value computed
with the same arithmetic in the same order as the whole-row kernels, so the two give the same bits
(tests/model/kernels/test_decode_step.py, test_prefill_step.py). What goes is the ~10 Python calls per layer
with their checks and temporaries (about a fifth of SmolLM2-135M's decode step on two threads), a team
wake per op, and x quantized again for each part of a fused matrix.

`StepLayers` is built once per model, pool and kind of step: it checks every layer's matrices (the
BlockMatrix parts their `apply` would multiply by through matmul.quant_matmul), norms and pages, and keeps
their addresses. Each step then hands it x and the step's `ops.RopeWriteKV` and `ops.PagedDecode` (or
`prefill.PagedPrefill`), which hold the checked rope tables, slots, block tables and context lengths.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from nvllm.model.kernels import matmul
from nvllm.model.kernels.ops import PagedDecode, RopeWriteKV
from nvllm.model.kernels.prefill import TILE, PagedPrefill
from nvllm.model.quant.blocks import BlockMatrix
from nvllm.model.quant.kv_format import F32, of_pool
from nvllm.model.quant.packed import PackedMatrix

_I64 = ctypes.c_int64
_P = ctypes.c_void_p


@dataclass(frozen=True)
class LayerSpec:
    """One layer as the C step multiplies it: each matrix as the BlockMatrix parts its rows are stored in,
    in output column order; the norms and bias float32 arrays."""
    input_norm: np.ndarray               # [H]
    qkv: tuple[BlockMatrix | PackedMatrix, ...]   # ((nq + 2 nkv) hd, H) together
    o: tuple[BlockMatrix | PackedMatrix, ...]     # (H, nq hd)
    post_norm: np.ndarray                # [H]
    gate_up: tuple[BlockMatrix | PackedMatrix, ...]   # (2 I, H)
    down: tuple[BlockMatrix | PackedMatrix, ...]  # (H, I)
    qkv_bias: np.ndarray | None = None   # [(nq + 2 nkv) hd]
    q_norm: np.ndarray | None = None     # [hd]
    k_norm: np.ndarray | None = None     # [hd]
    attn_out_norm: np.ndarray | None = None   # [H], Gemma 3's norm of the attention's output
    ffn_out_norm: np.ndarray | None = None    # [H], and of the MLP's
    window: int = 0                      # > 0: a sliding-window layer's keys
    local: bool = False                  # its rope from the step's local tables (a sliding layer's own base)
    nope: bool = False                   # SmolLM3: the layer takes no rope


class _Part(ctypes.Structure):
    _fields_ = [("fmt", _I64), ("w", _P), ("row_bytes", _I64), ("rows", _I64), ("n_in", _I64), ("col", _I64)]


class _Matrix(ctypes.Structure):
    _fields_ = [("parts", _P), ("count", _I64)]


class _Layer(ctypes.Structure):
    _fields_ = [("input_norm", _P), ("post_norm", _P), ("qkv_bias", _P), ("q_norm", _P), ("k_norm", _P),
                ("qkv", _Matrix), ("o", _Matrix), ("gate_up", _Matrix), ("down", _Matrix),
                ("k_pool", _P), ("v_pool", _P), ("attn_out_norm", _P), ("ffn_out_norm", _P), ("window", _I64),
                ("local", _I64), ("nope", _I64), ("group", _I64)]


class _Step(ctypes.Structure):
    _fields_ = [("layers", _P), ("num_layers", _I64), ("T", _I64), ("H", _I64), ("nq", _I64), ("nkv", _I64),
                ("hd", _I64), ("inter", _I64), ("bs", _I64), ("eps", ctypes.c_float), ("q_scale", ctypes.c_float),
                ("x", _P), ("h", _P), ("qkv", _P), ("attn", _P), ("gu", _P), ("act", _P), ("out", _P), ("cos", _P),
                ("sin", _P),
                ("slots", _P), ("block_tables", _P), ("table_stride", _P), ("context_lens", _P),
                ("threads", _I64), ("kv_fmt", _I64), ("cos_local", _P),
                ("sin_local", _P), ("gelu", _I64), ("nope_cos", _P), ("nope_sin", _P), ("qk_order", _P),
                ("qk_scratch", _P), ("tasks", _P), ("n_tasks", _I64), ("tile", _I64), ("positions", _P)]


def _vector(a: np.ndarray | None, size: int, name: str) -> int:
    """The address of a float32 [size] the kernels will read, or 0 for None."""
    if a is None:
        return 0
    if not isinstance(a, np.ndarray) or a.dtype != np.float32 or a.shape != (size,) or not a.flags.c_contiguous:
        got = f"{a.dtype} {list(a.shape)}" if isinstance(a, np.ndarray) else type(a).__name__
        raise ValueError(f"{name}: need a contiguous float32 [{size}], got {got}")
    return a.ctypes.data


class StepLayers:
    """Every layer of a step in one C call. Built once per model, pool [L, 2, NB, bs, nkv, hd] (in any KV
    format: quant/kv_format.py) and the matrices' parts for its rows; called per step (see __call__)."""

    def __init__(self, layers: Sequence[LayerSpec], pool: np.ndarray, num_q_heads: int, num_kv_heads: int,
                 head_dim: int, intermediate_size: int, eps: float, gelu: bool = False,
                 qk_order: np.ndarray | None = None, layer_slots: Sequence[int] | None = None,
                 layer_groups: Sequence[int] | None = None) -> None:
        """gelu: the MLP is GeGLU (Gemma's), else SwiGLU. qk_order: partial rotary's order of the q|k columns
        (decoder.rope_order), applied before rope. layer_slots, layer_groups: which slot of the pool and
        which group's slots and block tables each layer uses (model/kv_layout.py; None: one group, layer i
        in slot i)."""
        if matmul.lib is None:
            raise RuntimeError(f"the C step needs the matmul library: {matmul.describe()}")
        nq, nkv, hd, inter = int(num_q_heads), int(num_kv_heads), int(head_dim), int(intermediate_size)
        if not layers:
            raise ValueError("layers: need at least one")
        H = int(layers[0].input_norm.shape[0])
        fmt = of_pool(pool) if isinstance(pool, np.ndarray) else F32
        slot_of = list(range(len(layers))) if layer_slots is None else [int(s) for s in layer_slots]
        group_of = [0] * len(layers) if layer_groups is None else [int(g) for g in layer_groups]
        if len(slot_of) != len(layers) or len(group_of) != len(layers) or min(slot_of + group_of) < 0:
            raise ValueError(f"layer_slots, layer_groups: need {len(layers)} of each, none negative")
        self.num_groups = max(group_of) + 1
        num_slots = max(slot_of) + 1
        if (not isinstance(pool, np.ndarray) or not pool.flags.c_contiguous or not pool.flags.writeable
                or pool.ndim != 6 or pool.shape[0] != num_slots or pool.shape[1] != 2
                or pool.shape[4:] != (nkv, hd // fmt.per_element) or hd % fmt.per_element):
            raise ValueError(f"pool: need a writable contiguous [{num_slots}, 2, blocks, block size, {nkv}, "
                             f"{hd} values] in a KV format, got {getattr(pool, 'dtype', '')} "
                             f"{list(getattr(pool, 'shape', []))}")
        self.kv_format = fmt
        width = (nq + 2 * nkv) * hd
        qk = (nq + nkv) * hd
        if qk_order is not None and (not isinstance(qk_order, np.ndarray) or qk_order.dtype != np.int64
                                     or not np.array_equal(np.sort(qk_order), np.arange(qk))):
            raise ValueError(f"qk_order: need an int64 ordering of the {qk} q|k columns")
        self.qk_order = None if qk_order is None else np.ascontiguousarray(qk_order)
        self.nope = any(spec.nope for spec in layers)
        self.pool = pool
        self.dims = (H, nq, nkv, hd, inter)
        self._eps = float(eps)
        self._gelu = int(bool(gelu))
        self._local = any(spec.local for spec in layers)
        self._keep: list[object] = [pool]       # every array and structure the addresses point into
        self._layers = (_Layer * len(layers))()
        for i, (spec, c) in enumerate(zip(layers, self._layers)):
            c.input_norm = _vector(spec.input_norm, H, f"layers[{i}].input_norm")
            c.post_norm = _vector(spec.post_norm, H, f"layers[{i}].post_norm")
            c.qkv_bias = _vector(spec.qkv_bias, width, f"layers[{i}].qkv_bias")
            if (spec.q_norm is None) != (spec.k_norm is None):
                raise ValueError(f"layers[{i}]: q_norm and k_norm come together")
            c.q_norm = _vector(spec.q_norm, hd, f"layers[{i}].q_norm")
            c.k_norm = _vector(spec.k_norm, hd, f"layers[{i}].k_norm")
            for name, parts, n_in, n_out in (("qkv", spec.qkv, H, width), ("o", spec.o, nq * hd, H),
                                             ("gate_up", spec.gate_up, H, 2 * inter), ("down", spec.down, inter, H)):
                setattr(c, name, self._matrix(parts, n_in, n_out, f"layers[{i}].{name}"))
            c.k_pool = pool[slot_of[i], 0].ctypes.data
            c.v_pool = pool[slot_of[i], 1].ctypes.data
            c.group = group_of[i]
            if (spec.attn_out_norm is None) != (spec.ffn_out_norm is None):
                raise ValueError(f"layers[{i}]: attn_out_norm and ffn_out_norm come together")
            c.attn_out_norm = _vector(spec.attn_out_norm, H, f"layers[{i}].attn_out_norm")
            c.ffn_out_norm = _vector(spec.ffn_out_norm, H, f"layers[{i}].ffn_out_norm")
            c.window, c.local = max(0, int(spec.window)), int(spec.local)
            c.nope = int(spec.nope)
            self._keep.append(spec)

    def _matrix(self, parts: Sequence[BlockMatrix | PackedMatrix], n_in: int, n_out: int, name: str) -> _Matrix:
        row = (_Part * len(parts))()
        col = 0
        for p, c in zip(parts, row):
            _, shape, ggml_type, blocks, row_bytes = matmul.weight_args(p)
            if p.fmt.name not in matmul.FORMATS or shape[1] != n_in:
                raise ValueError(f"{name}: need parts of {n_in} inputs in a format with a kernel, got "
                                 f"{p.fmt.name} {list(shape)}")
            c.fmt, c.w, c.row_bytes, c.rows, c.n_in, c.col = ggml_type, blocks, row_bytes, shape[0], shape[1], col
            col += shape[0]
            self._keep.append(p)
        if not parts or col != n_out:
            raise ValueError(f"{name}: need parts of {n_out} rows together, got {col}")
        self._keep.append(row)
        return _Matrix(ctypes.addressof(row), len(parts))

    def __call__(self, x: np.ndarray, ropes: Sequence[RopeWriteKV], attentions: Sequence[PagedDecode | PagedPrefill],
                 threads: int, rope_local: RopeWriteKV | None = None,
                 scratch: Sequence[np.ndarray] | None = None) -> None:
        """x [T, H] float32, contiguous: the embeddings of the step's T rows, in place -> the residual stream
        after the last layer. ropes hold the step's rope tables and, per group of the layout, its slots;
        attentions each group's PagedDecode (a decode step: one sequence per row of x, the context lengths
        the same in every group) or PagedPrefill (any step: every sequence's rows, decode rows as chunks of
        one token); threads as the kernels take it; rope_local the local layers' tables, needed where a
        layer is local. scratch: (h, qkv, attn, out, gate_up, act), each a writable contiguous float32 [T, n]
        (attn [T, nq, hd]) for the step's activations, or None for new ones; h, attn and act may share
        memory, and so may qkv, out and gate_up (decoder.py's Workspace)."""
        H, nq, nkv, hd, inter = self.dims
        if (not isinstance(x, np.ndarray) or x.dtype != np.float32 or x.ndim != 2 or x.shape[1] != H
                or not x.flags.c_contiguous or not x.flags.writeable):
            raise ValueError(f"x: need a writable contiguous float32 [T, {H}], got {getattr(x, 'dtype', '')} "
                             f"{list(getattr(x, 'shape', []))}")
        T, G = x.shape[0], self.num_groups
        if len(ropes) != G or len(attentions) != G:
            raise ValueError(f"ropes, attentions: need one per group ({G}), got {len(ropes)} and {len(attentions)}")
        rope, attention = ropes[0], attentions[0]
        tasks = isinstance(attention, PagedPrefill)
        for r, a in zip(ropes, attentions):
            rows = a.num_tokens if isinstance(a, PagedPrefill) else a.num_seqs
            if r.heads[:3] != (nq, nkv, hd) or rows != T or isinstance(a, PagedPrefill) != tasks:
                raise ValueError(f"ropes, attentions: need {nq} q heads, {nkv} KV heads of {hd} and {T} rows of one "
                                 f"kind, got {r.heads[:3]} and {rows}")
            if isinstance(a, PagedDecode) and not np.array_equal(a._keep[1], attention._keep[1]):  # type: ignore[union-attr]
                raise ValueError("attentions: need the same context lengths in every group")
        matmul.check_threads(threads)
        _, _, nb, bs, _, _ = self.pool.shape
        cos, sin, _ = rope.addresses(nb * bs)
        slots = (ctypes.c_void_p * G)(*(r.addresses(nb * bs)[2] for r in ropes))   # raises for a slot outside
        cos_local = sin_local = 0
        if self._local:
            if (rope_local is None or rope_local.heads != rope.heads
                    or rope_local._keep[0].shape != rope._keep[0].shape):
                raise ValueError("rope_local: need the local layers' rope for the same heads and tokens")
            cos_local, sin_local, _ = rope_local.addresses(nb * bs)
        ctx = task_list = n_tasks = positions = 0
        prefills = [a for a in attentions if isinstance(a, PagedPrefill)]
        decodes = [a for a in attentions if isinstance(a, PagedDecode)]
        if prefills:
            found = [a.addresses(nb, bs, nkv) for a in prefills]
            tables = (ctypes.c_void_p * G)(*(f[0] for f in found))
            strides = np.array([f[1] for f in found], np.int64)
            _, _, task_list, n_tasks, positions = found[0]
        else:
            addresses = [a.addresses(nb, bs) for a in decodes]
            tables = (ctypes.c_void_p * G)(*(t for t, _, _ in addresses))
            strides = np.array([s for _, s, _ in addresses], np.int64)
            ctx = addresses[0][2]
        arrays = self._scratch(T, scratch)
        h, qkv, attn, out, gu, act = (a.ctypes.data for a in arrays)
        extra = [np.ones((T, hd // 2), np.float32), np.zeros((T, hd // 2), np.float32)] if self.nope else []
        nope_cos, nope_sin = (a.ctypes.data for a in extra) if extra else (0, 0)
        order = self.qk_order
        qk_scratch = np.empty((T, (nq + nkv) * hd), np.float32) if order is not None else None
        step = _Step(ctypes.addressof(self._layers), len(self._layers), T, H, nq, nkv, hd, inter, bs, self._eps,
                     rope.heads[3], x.ctypes.data, h, qkv, attn, gu, act, out, cos, sin, ctypes.addressof(slots),
                     ctypes.addressof(tables), strides.ctypes.data, ctx, int(threads), self.kv_format.code,
                     cos_local, sin_local, self._gelu, nope_cos, nope_sin,
                     order.ctypes.data if order is not None else 0,
                     qk_scratch.ctypes.data if qk_scratch is not None else 0, task_list, n_tasks, TILE, positions)
        rc = matmul.lib.decode_layers(ctypes.byref(step))   # type: ignore[union-attr]  # checked when built
        del arrays, extra
        if rc == -3:
            raise MemoryError(f"x: no memory for {T} rows quantized to integers")
        if rc == -4:
            raise MemoryError("attention: could not allocate its scratch")
        if rc != 0:  # step.py's checks make this unreachable; kept so a mismatch cannot pass silently
            raise ValueError(f"the C step refused its matrices (code {rc})")

    def _scratch(self, T: int, given: Sequence[np.ndarray] | None) -> list[np.ndarray]:
        """The step's (h, qkv, attn, out, gate_up, act) [T, n] each: given's, checked, or new ones."""
        H, nq, nkv, hd, inter = self.dims
        widths = (H, (nq + 2 * nkv) * hd, nq * hd, H, 2 * inter, inter)
        if given is None:
            return [np.empty((T, n), np.float32) for n in widths]
        names = ("h", "qkv", "attn", "out", "gate_up", "act")
        if len(given) != len(widths):
            raise ValueError(f"scratch: need {len(widths)} arrays ({', '.join(names)}), got {len(given)}")
        arrays = []
        for name, a, n in zip(names, given, widths):
            if (not isinstance(a, np.ndarray) or a.dtype != np.float32 or not a.flags.c_contiguous
                    or not a.flags.writeable or a.size != T * n or a.shape[0] != T):
                raise ValueError(f"scratch: {name} needs a writable contiguous float32 [{T}, {n}], got "
                                 f"{getattr(a, 'dtype', '')} {list(getattr(a, 'shape', []))}")
            arrays.append(a)
        return arrays
