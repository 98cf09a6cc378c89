"""x @ W.T with W read in its GGUF block format: the C kernels of csrc/matmul.c, built with the package as
nvllm.model.kernels._matmul and called through ctypes (which lets go of the GIL for the call).

`quant_matmul` checks its arguments, then runs the C kernel for the formats it reads (FORMATS) on
`threads` threads, or the NumPy twin `BlockMatrix.matmul` where the library was not built
(`lib` is None) or the format has no kernel. The kernel decodes each weight exactly as quant/dequantize.py
does and sums in float32 in a fixed order per output, so its result is the twin's within float32
rounding, and it does not depend on the thread count nor on the other rows of x.

F32 has a tile of its own, built for the few rows of x of a decode step as much as for prefill, in
variants for what the CPU has (FLOAT_VARIANTS: the best one is used; `set_float_variant` picks another,
for tests and measurements). `float_matmul` multiplies by a float32 array [out, in] in the same way, with
no BlockMatrix around it (a folder's weights). F16 and BF16 are packed as the formats below, multiplied
in float32 by csrc/dot_float.h (x never quantized; fdot.py beside this file is their twin, bit for bit).

Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL and the K-quants, IQ4_XS among them (INT_FORMATS), are multiplied
packed into panels of 8 rows (`pack`, quant/packed.py's layout; the loaders pack at load, and a BlockMatrix
given here is packed on first use): each row of x is quantized to 8 bits (blocks of 32, one float scale
each, as llama.cpp quantizes activations) and met with 8-bit integer dot instructions (csrc/dot_*.c; their
NumPy twin, bit for bit, is qdot.py beside this file). Their results then differ from the exact float
product by the rounding of x (~0.5% of |x||W| at worst; SmolLM2's perplexity moves by 0.05%), not by
float32 rounding alone. The "-i16" variants quantize x to 16 bits instead, held as two int8 planes, both
met by the 8-bit instructions: ~0.002% of |x||W| at worst (SmolLM2's top-1 tokens do not change), 1.1-1.7x
slower per kernel; they serve model.activations "exact", the default (and the C's own until one is set). The
variant is picked at run time from what the CPU has (INT_VARIANTS; "float", rows decoded from the panels,
where no SIMD one runs); `set_activations` picks the best one for
model.activations (the engine calls it), `set_int_variant` any one, for tests and measurements.

Prefill-sized x goes to the same integer kernels (1.2-2.7x BLAS here, each row the bits of a decode step);
F16, BF16 and activations "float" take `dequantized_matmul`: BLAS on rows decoded a chunk at a time.

NVLLM_KERNELS=0 in the environment turns these kernels off too, as it does the others (library.py).
The library's C types are declared in matmul_library.py, the arguments' checks made in matmul_checks.py;
`lib` here is the one loaded library every caller reads (and a test takes away to run the NumPy twins).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from nvllm.model.kernels.matmul_checks import check_out, check_threads, check_weight, check_x, float_blocks, ptr
from nvllm.model.kernels.matmul_library import open_matmul_library
from nvllm.model.quant.blocks import BlockMatrix, chunked_matmul
from nvllm.model.quant.formats import BlockFormat
from nvllm.model.quant.packed import PackedMatrix, pack_twin, packable, unpack_twin

PACKED_FLAG = 0x100  # csrc/packed.h: a format id's bit saying the weights are packed
# The formats with a C kernel, by name (every GGUF type nvllm reads); any other goes to the NumPy twin.
FORMATS = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
           "IQ4_NL", "IQ4_XS")
# The plain float tile's variants, by their number in csrc/matmul.c (portable: the build's baseline target).
FLOAT_VARIANTS = {"portable": 0, "avx2": 1, "avx512": 2, "neon": 3}
# The integer kernels' formats and variants, by their number in csrc/dot.c (float: x stays float32 and the
# weights are decoded, as for the other formats; scalar: portable C; then the SIMD ones; "-i16": exact x).
INT_FORMATS = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS")
INT_VARIANTS = {"float": 0, "scalar": 1, "avx2": 2, "avx512vnni": 3, "neon": 2, "neon-dotprod": 3,
                "scalar-i16": 4, "avx2-i16": 5, "avx512vnni-i16": 6, "neon-i16": 5, "neon-dotprod-i16": 6}



lib, _why_not = open_matmul_library()


def describe() -> str:
    """One line for logs and the bench: which code multiplies by the weights kept in their format."""
    if lib is None:
        return f"NumPy matmul by dequantized chunks ({_why_not})"
    return (f"C matmul in the weights' formats ({', '.join(FORMATS)}; others in NumPy; "
            f"plain floats: {float_variant()}; {'/'.join(INT_FORMATS)}: {int_variant()})")


def float_variants() -> list[str]:
    """The plain float tile's variants this machine runs (none without the library)."""
    if lib is None:
        return []
    mask = lib.matmul_float_variants()
    return [name for name, v in FLOAT_VARIANTS.items() if mask >> v & 1]


def float_variant() -> str:
    """The variant the plain float tile uses now ("" without the library)."""
    if lib is None:
        return ""
    v = lib.matmul_float_variant(-1)
    return next(name for name, n in FLOAT_VARIANTS.items() if n == v)


def set_float_variant(name: str) -> None:
    """Makes the plain float tile use variant `name` (one of float_variants()) from the next call on."""
    if name not in float_variants():
        raise ValueError(f"variant: {name!r} does not run here (runs: {', '.join(float_variants()) or 'none'})")
    assert lib is not None  # float_variants() is empty without it
    lib.matmul_float_variant(FLOAT_VARIANTS[name])


def int_variants() -> list[str]:
    """The integer dot products' variants this machine runs, "float" (no integer kernel) first; none
    without the library."""
    if lib is None:
        return []
    mask = lib.dot_variants()
    return [lib.dot_variant_name(v).decode() for v in range(7) if mask >> v & 1]


def int_variant() -> str:
    """The variant the INT_FORMATS use now ("" without the library)."""
    if lib is None:
        return ""
    return lib.dot_variant_name(lib.dot_variant(-1)).decode()


def set_int_variant(name: str) -> None:
    """Makes the INT_FORMATS use variant `name` (one of int_variants()) from the next call on."""
    if name not in int_variants():
        raise ValueError(f"variant: {name!r} does not run here (runs: {', '.join(int_variants()) or 'none'})")
    assert lib is not None  # int_variants() is empty without it
    lib.dot_variant(INT_VARIANTS[name])


def integer_products() -> bool:
    """Whether the INT_FORMATS are multiplied by integer dot products now (a variant but "float")."""
    return lib is not None and lib.dot_variant(-1) > 0


# model.activations -> the variants that serve it, best first ("float" where none of them runs)
ACTIVATIONS = {"exact": ("avx512vnni-i16", "avx2-i16", "neon-dotprod-i16", "neon-i16"),
               "int8": ("avx512vnni", "neon-dotprod", "avx2", "neon"), "float": ()}


def set_activations(kind: str) -> str:
    """model.activations: makes the INT_FORMATS use the best variant this machine runs for `kind` and
    returns its name ("float" where it has none; "" without the library)."""
    if kind not in ACTIVATIONS:
        raise ValueError(f"model.activations must be one of {', '.join(ACTIVATIONS)}, got {kind!r}")
    if lib is None:
        return ""
    runs = int_variants()
    name = next((v for v in ACTIVATIONS[kind] if v in runs), "float")
    set_int_variant(name)
    return name


def team_run(fn: int, arg: int, parts: int) -> None:
    """Runs the C function at address fn, void fn(void *arg, int part), for part = 0 .. parts - 1 on the
    kernels' thread team (csrc/team.c; the caller's thread among them): other kernels' way to share these
    threads (ops.PagedDecode). fn must not call back into this library."""
    assert lib is not None  # passed as team_run only with the library loaded
    lib.matmul_team_run(fn, arg, int(parts))


_pinned = False


def pin_threads(on: bool) -> None:
    """model.pin_threads: pins the team's thread i (the calling thread, which joins every team, being 0) to
    the i-th CPU of the process's allowed set, or unpins them (back to that set). Nothing to do without the
    library, nor to unpin what was never pinned."""
    global _pinned
    if not isinstance(on, bool):
        raise ValueError(f"model.pin_threads must be true or false, got {on!r}")
    if lib is None or on == _pinned:
        return
    if lib.matmul_pin_threads(int(on)) != 0:
        raise OSError("model.pin_threads: could not read the CPUs this process may use (sched_getaffinity)")
    _pinned = on


def team_stats(on: bool) -> tuple[int, float, int]:
    """The thread team's barriers since the last call: (barriers passed, seconds the threads waited at them
    summed over the threads, times a thread fell asleep there), then counting turned on or off (off until a
    bench asks: a serving step reads no clock for it). (0, 0.0, 0) without the library."""
    if lib is None:
        return 0, 0.0, 0
    out = np.zeros(3, np.int64)
    lib.matmul_team_stats(int(on), out.ctypes.data)
    return int(out[0]), float(out[1]) / 1e9, int(out[2])


def pack(w: BlockMatrix) -> PackedMatrix:
    """w's blocks repacked into panels (quant/packed.py's layout) by csrc/pack.c; by the NumPy twin without
    the library."""
    check_weight(w)
    if lib is None or not packable(w.fmt):
        return PackedMatrix(w.fmt, pack_twin(w), w.shape)   # the twin refuses a format not packed, naming it
    rows, n_in = w.shape
    data = np.empty(lib.pack_bytes(w.fmt.ggml_type, rows, n_in), np.uint8)
    lib.pack_panels(w.fmt.ggml_type, w.blocks.ctypes.data, rows, n_in, 0, -(-rows // 8), data.ctypes.data)
    return PackedMatrix(w.fmt, data, w.shape)


def pack_rows(fmt: BlockFormat, shape: tuple[int, int], fill: Callable[[int, int, np.ndarray], None],
              chunk_bytes: int = 16 << 20) -> PackedMatrix:
    """W [rows, in] of format fmt packed from its rows as fill(start, stop, out) writes their blocks into out
    (uint8 [stop - start, row bytes]), about chunk_bytes at a time: no whole copy of the blocks is made (a
    loader's rows come from the mapped file)."""
    rows, n_in = shape
    if lib is None or not packable(fmt) or n_in % fmt.block_elems:
        raise ValueError(f"w: a {fmt.name} weight {tuple(shape)} is not packed here")
    row_bytes = n_in // fmt.block_elems * fmt.block_bytes
    data = np.empty(lib.pack_bytes(fmt.ggml_type, rows, n_in), np.uint8)
    step = max(1, chunk_bytes // max(1, 8 * row_bytes)) * 8   # whole panels
    stage = np.empty((min(step, max(rows, 1)), row_bytes), np.uint8)
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        fill(r0, r1, stage[:r1 - r0])
        lib.pack_panels(fmt.ggml_type, stage.ctypes.data, rows, n_in, r0 // 8, -(-r1 // 8), data.ctypes.data)
    return PackedMatrix(fmt, data, (rows, n_in))


def unpack_rows(pm: PackedMatrix, start: int, stop: int) -> np.ndarray:
    """Rows start .. stop of a packed W as its GGUF blocks [stop - start, row bytes], byte for byte."""
    if not (isinstance(start, int) and isinstance(stop, int) and 0 <= start <= stop <= pm.shape[0]):
        raise ValueError(f"start, stop: need 0 <= start <= stop <= {pm.shape[0]}, got {start!r}, {stop!r}")
    if lib is None:
        return unpack_twin(pm, start, stop)
    out = np.empty((stop - start, pm.row_bytes), np.uint8)
    lib.unpack_rows(pm.fmt.ggml_type, pm.data.ctypes.data, pm.shape[1], start, stop, out.ctypes.data)
    return out


Matrix = BlockMatrix | PackedMatrix   # what the kernels multiply by


def weight_args(w: Matrix) -> tuple[np.ndarray, tuple[int, int], int, int, int]:
    """(bytes, shape, format id for the C kernels, bytes' address, row bytes) of a checked weight, kept on it:
    a decode step multiplies by each weight again and again, and checking it and taking its address cost as
    much as the product by a small matrix. A BlockMatrix in a packable format is packed on first use (the
    model's are packed at load: matrix.PackedWeight), its packed copy kept with the rest. Checked again if
    its blocks or shape are replaced."""
    if isinstance(w, PackedMatrix):
        c = w.__dict__.get("_c_args")
        if c is None or c[0] is not w.data:
            c = w.__dict__["_c_args"] = (w.data, w.shape, w.fmt.ggml_type | PACKED_FLAG, w.data.ctypes.data,
                                         w.row_bytes)
        return c
    if not isinstance(w, BlockMatrix):
        check_weight(w)
    c = w.__dict__.get("_c_args")
    if c is None or c[1] is not w.blocks or c[2] is not w.shape:
        check_weight(w)
        if lib is not None and packable(w.fmt):
            pm = pack(w)
            args = (pm.data, w.shape, w.fmt.ggml_type | PACKED_FLAG, pm.data.ctypes.data, w.blocks.shape[1])
        else:
            args = (w.blocks, w.shape, w.fmt.ggml_type, w.blocks.ctypes.data, w.blocks.shape[1])
        c = w.__dict__["_c_args"] = (args, w.blocks, w.shape)
    return c[0]


def float_matmul(w: np.ndarray, x: np.ndarray, threads: int, out: np.ndarray | None = None) -> np.ndarray:
    """x [T, in] float32 -> x @ w.T [T, out] float32 for a C-contiguous float32 w [out, in], by the plain
    float tile (float_blocks); into `out` when given."""
    return quant_matmul(float_blocks(w), x, threads, out)


def _blocks(w: Matrix) -> BlockMatrix:
    """w as a BlockMatrix, for the NumPy twins (a packed one unpacked: a copy)."""
    return w if isinstance(w, BlockMatrix) else BlockMatrix(w.fmt, unpack_rows(w, 0, w.shape[0]), w.shape)


def quant_matmul(w: Matrix, x: np.ndarray, threads: int, out: np.ndarray | None = None) -> np.ndarray:
    """x [T, in] float32 -> x @ W.T [T, out] float32, W read in its format; into `out` when given. Built for
    decode-sized x (QuantizedWeight.apply sends it up to DECODE_ROWS rows; dequantized_matmul takes longer ones)."""
    _, _, ggml_type, blocks, row_bytes = weight_args(w)
    n_out, n_in = w.shape
    check_x(x, n_in)
    check_threads(threads)
    T = x.shape[0]
    if out is None:
        out = np.empty((T, n_out), np.float32)
    else:
        check_out(out, (T, n_out), x)
    if lib is None or w.fmt.name not in FORMATS:
        out[...] = _blocks(w).matmul(x)
        return out
    if out.size == 0:
        return out
    rc = lib.quant_matmul(ggml_type, blocks, row_bytes, n_out, n_in, ptr(x), x.strides[0] // 4, T, ptr(out),
                          out.strides[0] // 4 if T > 1 else n_out, int(threads))
    if rc == -3:
        raise MemoryError(f"x: no memory for {T} rows of {n_in} values quantized to integers")
    if rc != 0:  # the checks above make this unreachable; kept so a mismatch cannot pass silently
        raise ValueError(f"w: the C matmul refused a {w.fmt.name} weight {w.shape} (code {rc})")
    return out


# Float32 values a thread's prefill scratch holds (8 MiB): every matrix of a small model is one chunk, so
# BLAS writes y itself; a larger model's are multiplied a few hundred rows at a time.
DEQUANT_CHUNK_VALUES = 1 << 21
_scratch = threading.local()


def dequantize_rows(w: Matrix, start: int, stop: int, threads: int = 1,
                    out: np.ndarray | None = None) -> np.ndarray:
    """Rows start:stop of W as float32 [stop - start, in] by the C decoders (bit for bit quant/dequantize.py's),
    on `threads` threads, into `out` when given; NumPy's where the library was not built or the format
    has no kernel."""
    _, _, ggml_type, blocks, row_bytes = _decode_args(w)
    check_threads(threads)
    n_out, n_in = w.shape
    if not (isinstance(start, int) and isinstance(stop, int) and 0 <= start <= stop <= n_out):
        raise ValueError(f"start, stop: need 0 <= start <= stop <= {n_out}, got {start!r}, {stop!r}")
    if out is None:
        out = np.empty((stop - start, n_in), np.float32)
    elif out.dtype != np.float32 or out.shape != (stop - start, n_in) or not out.flags.c_contiguous:
        raise ValueError(f"out: need a C-contiguous float32 [{stop - start}, {n_in}], got {out.dtype} "
                         f"{list(out.shape)}")
    if lib is None or w.fmt.name not in FORMATS:
        out[...] = _blocks(w).dequantize()[start:stop]
    elif out.size:
        lib.quant_dequantize(ggml_type, blocks, row_bytes, start, stop, n_in, ptr(out), int(threads))
    return out


def _decode_args(w: Matrix) -> tuple[np.ndarray, tuple[int, int], int, int, int]:
    """weight_args for decoding rows: a BlockMatrix's own blocks (decoded in place: packing it first would
    cost a copy and a slower decode), a PackedMatrix's panels."""
    if isinstance(w, PackedMatrix):
        return weight_args(w)
    check_weight(w)
    return w.blocks, w.shape, w.fmt.ggml_type, w.blocks.ctypes.data, w.blocks.shape[1]


def dequantized_matmul(w: Matrix, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """x [T, in] float32 -> x @ W.T [T, out] float32 by BLAS on W's rows dequantized a chunk at a time (by
    the C decoders, each value exactly quant/dequantize.py's): for many rows of x (prefill), where BLAS's packed
    GEMM beats the tiles of quant_matmul. The NumPy twin is BlockMatrix.matmul itself, with NumPy's
    decoder. Into `out` when given (as quant_matmul takes it). The decoding (7 G values/s, 2-3% of the GEMM
    at 512 rows) stays on the calling thread: the team's threads would compete with BLAS's, which spin a
    while after each GEMM (measured: up to 2x slower on 2 cores)."""
    _decode_args(w)
    n_out, n_in = w.shape
    check_x(x, n_in)
    if out is not None:
        check_out(out, (x.shape[0], n_out), x)
    if lib is None or w.fmt.name not in FORMATS:
        return _blocks(w).matmul(x, out=out)
    if w.fmt.name == "F32":   # never packed: BLAS on the blocks themselves
        return _blocks(w).matmul(x, out=out)
    buf = getattr(_scratch, "buf", None)
    if buf is None or buf.size != DEQUANT_CHUNK_VALUES:
        buf = _scratch.buf = np.empty(DEQUANT_CHUNK_VALUES, np.float32)
    y = np.empty((x.shape[0], n_out), np.float32) if out is None else out
    return chunked_matmul(w.shape, x, lambda start, stop, out: dequantize_rows(w, start, stop, 1, out), buf, y)
