"""Integer dot products on x quantized to 16 or 8 bits (csrc/dot_*.c, through kernels/matmul.quant_matmul),
held bit for bit to their NumPy twin model/kernels/qdot.py, in every variant this machine runs (both scalar
fallbacks included), for every format with such kernels; and the twin held to the exact float product
within the error that rounding x allows.

The bound: a block of x with largest magnitude amax is rounded to steps of d = amax / Q (Q = 127 for
8 bits, 32512 for 16), so each value moves by at most d / 2 = amax / 2Q, and an output by at most sum
over blocks of amax / 2Q * sum |w| over the block's 32 weights; plus float32 rounding of the sums (RTOL
of |x| @ |W|.T, as in test_matmul_kernels.py). A wrong scale, nibble or sign is off by far more.
"""
from __future__ import annotations

import zlib
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT

from helpers.gguf_util import random_blocks
from helpers.paths import GOLDEN
from nvllm.model.kernels import matmul as mk
from nvllm.model.kernels import peak, qdot
from nvllm.model.matrix.quantized import QuantizedWeight
from nvllm.model.quant.formats import FORMATS

# Also run under emulated aarch64 (deploy/aarch64-check.sh): NEON, NEON with sdot, and the scalar code.
pytestmark = [pytest.mark.aarch64, pytest.mark.usefixtures("keep_int_variant")]

FORMAT = {f.name: f for f in FORMATS.values()}
RTOL = 1e-5
T_SIZES = [1, 2, 3, 4, 5, 6, 7, 16, 33, 64, 200]
# (rows, blocks per row): rows not a multiple of the kernel's 4; one block; the model's 18 and 48
LAYOUTS = [(1, 1), (5, 1), (7, 18), (37, 5), (12, 48)]
VARIANTS = [v for v in mk.int_variants() if v != "float"]
INT8 = [v for v in VARIANTS if not v.endswith("-i16")]
INT16 = [v for v in VARIANTS if v.endswith("-i16")]
QMAX = {8: 127, 16: 32512}
K_QUANTS = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS")   # in whole super-blocks of 256


def width(name: str, blocks: int) -> int:
    """Row length of about `blocks` blocks of 32: whole super-blocks of 256 for the K-quants."""
    return 256 * -(-blocks // 8) if name in K_QUANTS else 32 * blocks


def bits(variant: str) -> int:
    """How many bits the variant quantizes x to."""
    return 16 if variant.endswith("-i16") else 8

needs_lib = pytest.mark.skipif(mk.lib is None, reason="the C matmul was not built (no C compiler at install)")


def rng_for(*what: object) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(what).encode()))


def random_weight(name: str, rows: int, n_in: int, rng: np.random.Generator) -> QuantizedWeight:
    raw = random_blocks(rng, GT[name], (rows, n_in))
    return QuantizedWeight(FORMAT[name], np.ascontiguousarray(raw), (rows, n_in))


def quantized_weight(name: str, rows: int, n_in: int, rng: np.random.Generator) -> QuantizedWeight:
    """Normal weights quantized as a converter writes them (by gguf.quants; Q4_K by nvllm's quantizer; the
    others, which neither writes, random blocks)."""
    data = (rng.standard_normal((rows, n_in)) * 0.05).astype(np.float32)
    if name == "Q4_K":
        from nvllm.model.quant.quantize import quantize
        return QuantizedWeight(FORMAT[name], quantize(FORMAT[name], data), (rows, n_in))
    if name in ("Q2_K", "Q3_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"):
        return random_weight(name, rows, n_in, rng)
    raw = np.ascontiguousarray(gguf.quants.quantize(data, GT[name])).view(np.uint8).reshape(rows, -1)
    return QuantizedWeight(FORMAT[name], raw, (rows, n_in))


def run(w: QuantizedWeight, x: np.ndarray, variant: str, threads: int = 1) -> np.ndarray:
    mk.set_int_variant(variant)
    return mk.quant_matmul(w, x, threads=threads)


@needs_lib
def test_the_best_variant_is_used_and_the_scalar_ones_always_run() -> None:
    runs = mk.int_variants()
    assert runs[:2] == ["float", "scalar"] and "scalar-i16" in runs
    assert [v + "-i16" for v in INT8] == INT16   # every instruction set takes both activations
    # the default is the fastest 16-bit one (model.activations' default, exact: listed last); without SIMD
    # the float path beats the portable C
    assert mk.int_variant() == (runs[-1] if len(runs) > 3 else "float")
    assert mk.int_variant() in mk.describe()
    for v in VARIANTS:   # the 8-bit ones stay selectable
        mk.set_int_variant(v)
        assert mk.int_variant() == v


@needs_lib
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", qdot.FORMATS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_variant_equals_the_twin_bitwise(name: str, layout: tuple, variant: str) -> None:
    rows, blocks = layout
    rng = rng_for(name, layout)
    w = random_weight(name, rows, width(name, blocks), rng)
    for T in T_SIZES:
        x = rng.standard_normal((T, w.shape[1])).astype(np.float32)
        np.testing.assert_array_equal(run(w, x, variant), qdot.matmul(w, x, bits(variant)), err_msg=f"T={T}")


@needs_lib
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", qdot.FORMATS)
def test_prefill_sized_and_gguf_quantized_weights(name: str, variant: str) -> None:
    rng = rng_for("prefill", name)
    n_in = width(name, 18)
    w = quantized_weight(name, 70, n_in, rng)
    x = (rng.standard_normal((300, n_in)) * 3).astype(np.float32)
    np.testing.assert_array_equal(run(w, x, variant, threads=2), qdot.matmul(w, x, bits(variant)))


@needs_lib
@pytest.mark.parametrize("variant", VARIANTS)
def test_the_largest_products_sum_exactly_in_int32(variant: str) -> None:
    # Q8_0's quants at -128 (a converter writes -127 at most; the blocks allow -128) against x at its
    # largest quant everywhere: 32 * 128 * 32512 < 2^27 per block in 16 bits, no lane overflows
    n_in = 64
    blocks = np.zeros((3, 2 * 34), np.uint8)
    for r, q in enumerate((-128, 127, -1)):
        for b in range(2):
            blocks[r, 34 * b:34 * b + 2] = np.frombuffer(np.float16(1.0).tobytes(), np.uint8)
            blocks[r, 34 * b + 2:34 * b + 34] = np.uint8(q & 255)
    w = QuantizedWeight(FORMAT["Q8_0"], blocks, (3, n_in))
    x = np.full((2, n_in), 3.0, np.float32)
    x[1, ::2] = -3.0
    y = run(w, x, variant)
    np.testing.assert_array_equal(y, qdot.matmul(w, x, bits(variant)))
    np.testing.assert_allclose(y, w.matmul(x), rtol=1e-6, atol=1e-3)


@needs_lib
@pytest.mark.parametrize("name", qdot.FORMATS)
def test_threads_and_batch_neighbours_do_not_change_a_bit(name: str) -> None:
    rng = rng_for("threads", name)
    n_in = width(name, 5)
    w = random_weight(name, 67, n_in, rng)
    x = rng.standard_normal((70, n_in)).astype(np.float32)
    for variant in VARIANTS:
        y1 = run(w, x, variant, threads=1)
        for threads in (2, 3, 8):
            np.testing.assert_array_equal(run(w, x, variant, threads=threads), y1)
        for t in (0, 33, 69):   # a row alone gets the bits it gets in the batch (the engine's exactness)
            np.testing.assert_array_equal(run(w, x[t:t + 1], variant, threads=2)[0], y1[t])
        np.testing.assert_array_equal(run(w, x[5:22], variant, threads=1), y1[5:22])


def rounding_bound(w: QuantizedWeight, x: np.ndarray, nbits: int) -> np.ndarray:
    """What rounding x to blocks of `nbits` may move each output by, plus float32 rounding (module doc)."""
    T, n_in = x.shape
    amax = np.abs(x.astype(np.float64)).reshape(T, n_in // 32, 32).max(axis=2)          # [T, nb]
    wabs = np.abs(w.dequantize().astype(np.float64)).reshape(w.shape[0], n_in // 32, 32).sum(axis=2)  # [out, nb]
    return amax @ wabs.T / (2 * QMAX[nbits]) + RTOL * (np.abs(x) @ np.abs(w.dequantize()).T) + 1e-30


@pytest.mark.parametrize("nbits", [8, 16])
@pytest.mark.parametrize("name", qdot.FORMATS)
def test_the_twin_is_the_float_product_within_the_rounding_of_x(name: str, nbits: int) -> None:
    rng = rng_for("bound", name)
    w = quantized_weight(name, 40, 256, rng)
    x = rng.standard_normal((9, 256)).astype(np.float32)
    x[3] *= 1e-3     # tiny rows and one with a lone large value: the scale follows each block
    x[4, 17] = 40.0
    err = np.abs(qdot.matmul(w, x, nbits).astype(np.float64) - w.matmul(x))
    bound = rounding_bound(w, x, nbits)
    assert np.all(err <= bound), f"worst {float(np.max(err / bound)):.3f} of the bound"
    if nbits == 8:   # the bound is not vacuous: x was rounded (in 16 bits float32 rounding is as large)
        assert float(np.max(err / bound)) > 0.01
    else:            # and 16 bits are much closer than 8
        assert float(np.max(err)) < float(np.max(np.abs(qdot.matmul(w, x, 8) - w.matmul(x)))) / 30


def test_quantize_rows_rounds_each_block_to_its_own_scale() -> None:
    x = np.zeros((2, 64), np.float32)
    x[0, :32] = np.linspace(-2.0, 1.0, 32, dtype=np.float32)
    x[0, 32] = 0.5                                      # a block holding one value: q = 127 there
    x[1, :4] = [127.0, 0.5, 1.5, -2.5]                  # d = 1: halves round to even
    d, q, s = qdot.quantize_rows(x, 8)
    assert d.dtype == np.float32 and q.dtype == np.int8 and s.dtype == np.float32
    assert d[0, 0] == np.float32(2.0) / np.float32(127) and q[0, 0, 0] == -127
    assert q[0, 1, 0] == 127 and not q[0, 1, 1:].any()
    assert list(q[1, 0, :4]) == [127, 0, 2, -2] and d[1, 1] == 0 and not q[1, 1].any()
    assert s[1, 0] == np.float32(127)
    assert np.all(np.abs(q.astype(np.int32)) <= 127)
    back = (d[:, :, None] * q).reshape(2, 64)
    assert np.all(np.abs(back - x) <= np.repeat(d, 32, axis=1) / 2 * (1 + 1e-6))


def test_quantize_rows_in_16_bits() -> None:
    x = np.zeros((2, 64), np.float32)
    x[0, :32] = np.linspace(-2.0, 1.0, 32, dtype=np.float32)
    x[0, 32] = 0.5
    x[1, :4] = [32512.0, 0.5, 1.5, -2.5]                # d = 1: halves round to even
    d, q, s = qdot.quantize_rows(x, 16)
    assert d.dtype == np.float32 and q.dtype == np.int16 and s.dtype == np.float32
    assert d[0, 0] == np.float32(2.0) / np.float32(32512) and q[0, 0, 0] == -32512
    assert q[0, 1, 0] == 32512 and not q[0, 1, 1:].any()
    assert list(q[1, 0, :4]) == [32512, 0, 2, -2] and s[1, 0] == np.float32(32512)
    back = (d[:, :, None] * q).reshape(2, 64)
    assert np.all(np.abs(back - x) <= np.repeat(d, 32, axis=1) / 2 * (1 + 1e-6))
    with pytest.raises(ValueError, match=r"^bits: need 8 or 16"):
        qdot.quantize_rows(x, 4)


@needs_lib
@pytest.mark.parametrize("variant", VARIANTS)
def test_nan_and_inf_in_x_stay_in_their_row(variant: str) -> None:
    rng = rng_for("nan")
    for name in qdot.FORMATS:
        w = random_weight(name, 8, width(name, 2), rng)
        x = rng.standard_normal((3, w.shape[1])).astype(np.float32)
        x[1, 5] = np.nan
        x[2, 40] = -np.inf
        y = run(w, x, variant, threads=2)
        assert np.isfinite(y[0]).all() and np.isnan(y[1]).all() and np.isnan(y[2]).all()
        np.testing.assert_array_equal(y, qdot.matmul(w, x, bits(variant)))


@needs_lib
def test_strided_rows_of_x_a_given_out_and_empty_shapes() -> None:
    mk.set_int_variant(VARIANTS[-1])
    rng = rng_for("strided")
    w = random_weight("Q4_1", 10, 512, rng)
    wide = rng.standard_normal((6, 700)).astype(np.float32)
    x = wide[:, 100:612]
    out = np.full((6, 10), np.nan, np.float32)
    assert mk.quant_matmul(w, x, threads=2, out=out) is out
    np.testing.assert_array_equal(out, qdot.matmul(w, np.ascontiguousarray(x), bits(mk.int_variant())))
    assert mk.quant_matmul(w, np.zeros((0, 512), np.float32), threads=2).shape == (0, 10)
    none = QuantizedWeight(FORMAT["Q8_0"], np.zeros((3, 0), np.uint8), (3, 0))
    np.testing.assert_array_equal(mk.quant_matmul(none, np.ones((2, 0), np.float32), threads=1), np.zeros((2, 3)))


@needs_lib
def test_the_float_variant_is_the_exact_path() -> None:
    rng = rng_for("float")
    w = random_weight("Q8_0", 9, 64, rng)
    x = np.eye(64, dtype=np.float32)   # one-hot rows expose the decoded weights, bit for bit
    np.testing.assert_array_equal(run(w, x, "float").T, w.dequantize())
    assert not np.array_equal(run(w, x, VARIANTS[-1]).T, w.dequantize())


# The multiply-accumulates one iteration of each instruction set's peak loop makes (csrc/peak.h): its 8-bit
# instruction's products (a 512-bit vpdpbusd 64, AVX2's maddubs + madd 32; sdot and NEON's smull + sadalp
# step 16) x the chains in flight x two rounds. The instructions that add into their accumulator need 10 or
# more chains to be timed at their throughput, not their latency. An exact ("-i16") variant counts half:
# each of its 16-bit products takes two of the 8-bit instruction's.
PEAK_PER_ROUND = {"scalar": 4 * 1 * 2, "avx2": 4 * 32 * 2, "avx512vnni": 12 * 64 * 2,
                  "neon": 8 * 16 * 2, "neon-dotprod": 16 * 16 * 2}
PEAK_PER_ROUND.update({f"{name}-i16": n // 2 for name, n in PEAK_PER_ROUND.items()})


@needs_lib
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variant_has_an_integer_peak(variant: str) -> None:
    # products counted, not timed: reps iterations of the chains' worth each
    assert mk.lib is not None  # needs_lib
    v = mk.INT_VARIANTS[variant]
    per_round = mk.lib.dot_peak(v, 1)
    assert per_round == PEAK_PER_ROUND[variant] and mk.lib.dot_peak(v, 1000) == 1000 * per_round
    assert peak.int_peak_gops(variant, 1, seconds=0.01) > 0
    assert peak.int_peak_gops(variant, 2, seconds=0.01) > 0


@needs_lib
def test_the_integer_peak_refuses_what_has_none() -> None:
    for name in ("float", "sse9"):
        with pytest.raises(ValueError, match="variant"):
            peak.int_peak_gops(name, 1)
    with pytest.raises(ValueError, match="threads"):
        peak.int_peak_gops(VARIANTS[0], 0)
    assert mk.lib is not None  # needs_lib
    assert mk.lib.dot_peak(0, 10) == 0 and mk.lib.dot_peak(99, 10) == 0


@pytest.mark.parametrize("name", ["sse9", "", "FLOAT", 3])
def test_an_unknown_variant_is_refused_naming_it(name: object) -> None:
    with pytest.raises(ValueError, match=r"^variant: "):
        mk.set_int_variant(name)  # type: ignore[arg-type]


def test_the_twin_refuses_formats_and_shapes_it_has_no_kernel_for() -> None:
    rng = rng_for("refuse")
    with pytest.raises(ValueError, match=r"^w: no integer kernel for F16"):
        qdot.matmul(random_weight("F16", 2, 256, rng), np.zeros((1, 256), np.float32))
    with pytest.raises(ValueError, match=r"^x: need \[T, 64\]"):
        qdot.matmul(random_weight("Q8_0", 2, 64, rng), np.zeros((1, 32), np.float32))


# ---------------------------------------------------------------- a whole model on x quantized
# The rule for a model's logits (the looser one): greedy agreement with the exact float path at
# every position whose top-2 margin there exceeds MARGIN, and logits within LOGIT_TOL of it (max) and
# LOGIT_MEAN_TOL (mean). Each matmul moves by at most the rounding bound above (in 8 bits ~0.5% of
# |x||W| at worst, ~0.1% typically; 258 times less in 16 bits); compounded through SmolLM2's 30 layers,
# the shipped Q4_1 file's logits (of magnitude up to ~40) moved from transformers' on the golden prompts
# by 1.46 at most and 0.27 on average (the worst prompt's mean) with x in 8 bits, by 0.0070 and 0.0014
# in 16 bits, and no clear top-1 changed; the tolerances leave ~40% headroom.
LOGIT_TOL = {8: 2.0, 16: 0.01}
LOGIT_MEAN_TOL = {8: 0.4, 16: 0.002}
MARGIN = 0.5


@needs_lib
@pytest.mark.parametrize("variant", [INT8[-1], INT16[-1]])
def test_smollm2_gguf_logits_keep_their_top_1_and_stay_near_transformers(smollm2_gguf: Path, variant: str) -> None:
    from safetensors.numpy import load_file

    from nvllm.model.decoder import ForwardBatch, Model
    from nvllm.model.weights.gguf_file import read_gguf
    from nvllm.model.weights.gguf_weights import load_gguf_weights

    golden = load_file(str(GOLDEN / "smollm2-135m-instruct.safetensors"))
    subset = golden.get("vocab_subset")
    cases = [(golden["prompt_ids"], golden["logits_subset" if subset is not None else "logits"])]
    i = 0
    while f"batch_{i}_ids" in golden:
        key = f"batch_{i}_logits" + ("_subset" if subset is not None else "")
        cases.append((golden[f"batch_{i}_ids"], golden[key]))
        i += 1
    g = read_gguf(smollm2_gguf)
    model = Model(g.config, load_gguf_weights(g))
    mk.set_int_variant(variant)
    worst, flips = 0.0, []
    means: list[float] = []
    for ids, ref in cases:
        n, bs = len(ids), 16
        blocks = -(-n // bs)
        pos = np.arange(n)
        fb = ForwardBatch.build(ids, pos, pos, np.array([n]), np.array([n]), np.arange(blocks, dtype=np.int32)[None],
                                np.arange(n))
        ours = model.forward(fb, model.make_kv_cache(blocks, bs))
        ours = ours if subset is None else ours[:, subset]
        d = np.abs(ours - ref)
        worst, means = max(worst, float(d.max())), means + [float(d.mean())]
        top2 = np.sort(ref, axis=1)[:, -2:]
        clear = top2[:, 1] - top2[:, 0] > MARGIN
        flips += [int(np.sum(clear & (ours.argmax(1) != ref.argmax(1))))]
    print(f"\nSmolLM2 Q4_1, {variant}: max |logit diff| {worst:.4f}, mean {max(means):.4f}, flips {flips}")
    nbits = bits(variant)
    assert worst <= LOGIT_TOL[nbits] and max(means) <= LOGIT_MEAN_TOL[nbits] and not any(flips)


@needs_lib
@pytest.mark.parametrize("name", K_QUANTS)
def test_every_variant_takes_the_k_quants_off_the_float_path(name: str) -> None:
    rng = rng_for("k8", name)
    w = random_weight(name, 9, 512, rng)
    x = rng.standard_normal((3, 512)).astype(np.float32)
    want = run(w, x, "float")
    for variant in VARIANTS:
        assert not np.array_equal(run(w, x, variant), want), variant
