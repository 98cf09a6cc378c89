"""model/quant/quantize.py: float32 -> GGUF blocks, as llama.cpp's reference quantizers write them.

Q8_0, Q5_0, Q4_0, BF16 and F16 are compared byte for byte with the `gguf` package's quantizers (which
match llama.cpp's); Q6_K and Q4_K, which gguf does not write, with plain scalar transcriptions of
llama.cpp's quantize_row_q6_K_ref and quantize_row_q4_K_ref below, float32 operation by float32
operation. Round trips go through model/quant/dequantize.py's dequantizers and are held to the error
bound of llama.cpp's test-quantize-fns.
"""
from __future__ import annotations

import logging

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

from helpers.quant_ref import ref_nearest_int, ref_quantize_row_q4_k
from nvllm import cli
from nvllm.cli.serve import settings_from_args
from nvllm.config import ConfigError, load_settings
from nvllm.model.matrix.quantized import QuantizedWeight
from nvllm.model.quant import quantize as qz
from nvllm.model.quant.dequantize import dequantize
from nvllm.model.quant.formats import FORMATS
from nvllm.model.weights import conversion

FMT = {f.name: f for f in FORMATS.values()}
F = np.float32


def special_rows(n: int) -> np.ndarray:
    """Rows [8, n] of awkward values: normal weights, zeros, a constant, all negative, one outlier,
    values too small for a float16 scale, halves that sit on rounding ties, mixed magnitudes."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((8, n)) * 0.05).astype(F)
    x[1] = 0
    x[2] = 0.75
    x[3] = -np.abs(x[3]) - 0.01
    x[4, n // 3] = 9.0
    x[5] *= F(1e-7)
    x[6, :32] = np.arange(32) - F(15.5)  # Q8_0: scale 1/8 of 127 steps lands on halves
    x[6, 32:64] = np.linspace(-8, 7.5, 32, dtype=F)
    x[7, :32] *= 1000  # one loud sub-block beside quiet ones: their 6-bit scales round to 0
    return x


def skewed_rows(n: int) -> np.ndarray:
    """All positive (the fitted offset would rise above 0 and is held there), heavy-tailed, near-flat."""
    rng = np.random.default_rng(5)
    return np.stack([rng.uniform(0.2, 1.0, n), rng.standard_t(2, n) * 0.02,
                     1 + rng.standard_normal(n) * 1e-4, -rng.exponential(0.1, n)]).astype(F)


def random_rows(rows: int, n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((rows, n)) * rng.uniform(0.01, 1, (rows, 1))).astype(F)


# ---------------------------------------------------------------- against gguf


@pytest.mark.parametrize("name", ["Q8_0", "Q5_0", "Q5_1", "Q4_0", "BF16", "F16"])
@pytest.mark.parametrize("x", [special_rows(256), random_rows(33, 544)], ids=["special", "random"])
def test_bit_identical_to_gguf(name, x):
    ours = qz.quantize(FMT[name], x)
    with np.errstate(all="ignore"):
        ref = np.asarray(gguf_quantize(x, GGMLQuantizationType[name])).view(np.uint8).reshape(ours.shape)
    assert ours.dtype == np.uint8 and ours.shape == ref.shape
    assert np.array_equal(ours, ref)


def test_bf16_nan_and_inf_as_gguf():
    x = np.array([[np.nan, -np.nan, np.inf, -np.inf, 3.4e38, -3.4e38, 1e-45, -0.0]], F)
    x = np.concatenate([x, x.view(np.uint32).__or__(np.uint32(1)).view(F)], axis=0)  # NaN payloads
    ours = qz.quantize(FMT["BF16"], x)
    ref = np.asarray(gguf_quantize(x, GGMLQuantizationType.BF16)).view(np.uint8).reshape(ours.shape)
    assert np.array_equal(ours, ref)


# ---------------------------------------------------------------- Q4_K against the reference


@pytest.mark.parametrize("x", [special_rows(512), skewed_rows(512), random_rows(3, 768, seed=3)],
                         ids=["special", "skewed", "random"])
def test_q4_k_bit_identical_to_the_reference(x):
    ours = qz.quantize(FMT["Q4_K"], x)
    assert ours.shape == (len(x), x.shape[1] // 256 * 144)
    for r in range(len(x)):
        assert ours[r].tobytes() == ref_quantize_row_q4_k(x[r]), f"row {r}"


def test_q4_k_blocks_read_back_by_gguf_as_by_nvllm():
    """The layout (scale packing, nibble order) is the one llama.cpp's readers expect."""
    x = random_rows(4, 512, seed=5)
    blocks = qz.quantize(FMT["Q4_K"], x)
    ours = dequantize(FMT["Q4_K"], blocks.reshape(-1), x.shape)
    np.testing.assert_array_equal(ours, gguf_dequantize(blocks, GGMLQuantizationType.Q4_K))


# ---------------------------------------------------------------- Q6_K against the reference


def ref_make_qx_quants(x, nmax=32):
    """make_qx_quants(n=16, nmax, rmse_type=1, qw=NULL), a line of C for a line of Python."""
    amax, big = F(0), F(0)
    for v in x:
        if abs(v) > amax:
            amax, big = abs(v), v
    if amax < F(1e-15):
        return [0] * len(x), F(0)

    def sums(iscale):
        sumlx = suml2 = F(0)
        ls = []
        for v in x:
            q = max(-nmax, min(nmax - 1, ref_nearest_int(F(iscale * v))))
            ls.append(q)
            w = F(v * v)
            sumlx = F(sumlx + F(F(w * v) * F(q)))
            suml2 = F(suml2 + F(F(w * F(q)) * F(q)))
        return ls, sumlx, suml2

    ls, sumlx, suml2 = sums(F(F(-nmax) / big))
    L = [q + nmax for q in ls]
    scale = F(sumlx / suml2) if suml2 else F(0)
    best = F(scale * sumlx)
    for i in range(-9, 10):
        if i == 0:
            continue
        ls, sumlx, suml2 = sums(F(-F(F(nmax) + F(F(0.1) * F(i))) / big))
        if suml2 > 0 and F(sumlx * sumlx) > F(best * suml2):
            L = [q + nmax for q in ls]
            scale = F(sumlx / suml2)
            best = F(scale * sumlx)
    return L, scale


def ref_quantize_row_q6_k(x: np.ndarray) -> bytes:
    """quantize_row_q6_K_ref over one row (a whole number of 256-value super-blocks)."""
    out = bytearray()
    for b in range(len(x) // 256):
        xb = x[256 * b:256 * (b + 1)]
        L = [0] * 256
        scales = [F(0)] * 16
        max_scale = max_abs = F(0)
        for j in range(16):
            L[16 * j:16 * (j + 1)], scales[j] = ref_make_qx_quants(xb[16 * j:16 * (j + 1)])
            if abs(scales[j]) > max_abs:
                max_abs, max_scale = abs(scales[j]), scales[j]
        if max_abs < F(1e-15):
            out += bytes(210)
            continue
        iscale = F(F(-128) / max_scale)
        d16 = np.float16(F(F(1) / iscale))
        sc = [min(127, ref_nearest_int(F(iscale * s))) for s in scales]
        for j in range(16):
            d = F(F(d16) * F(sc[j]))
            if not d:
                continue
            for i in range(16):
                L[16 * j + i] = max(-32, min(31, ref_nearest_int(F(xb[16 * j + i] / d)))) + 32
        ql, qh = [0] * 128, [0] * 64
        for h in range(2):
            j = 128 * h
            for k in range(32):
                ql[64 * h + k] = (L[j + k] & 0xF) | ((L[j + k + 64] & 0xF) << 4)
                ql[64 * h + k + 32] = (L[j + k + 32] & 0xF) | ((L[j + k + 96] & 0xF) << 4)
                qh[32 * h + k] = ((L[j + k] >> 4) | ((L[j + k + 32] >> 4) << 2) | ((L[j + k + 64] >> 4) << 4)
                                  | ((L[j + k + 96] >> 4) << 6))
        out += bytes(ql) + bytes(qh) + np.array(sc, np.int8).tobytes() + np.array([d16], "<f2").tobytes()
    return bytes(out)


@pytest.mark.parametrize("x", [special_rows(256), skewed_rows(256), random_rows(3, 512, seed=4)],
                         ids=["special", "skewed", "random"])
def test_q6_k_bit_identical_to_the_reference(x):
    ours = qz.quantize(FMT["Q6_K"], x)
    assert ours.shape == (len(x), x.shape[1] // 256 * 210)
    for r in range(len(x)):
        assert ours[r].tobytes() == ref_quantize_row_q6_k(x[r]), f"row {r}"


@pytest.mark.parametrize("name", ["Q6_K", "Q5_0"])
def test_blocks_read_back_by_gguf_as_by_nvllm(name):
    x = random_rows(4, 512, seed=5)
    blocks = qz.quantize(FMT[name], x)
    ours = dequantize(FMT[name], blocks.reshape(-1), x.shape)
    np.testing.assert_array_equal(ours, gguf_dequantize(blocks, GGMLQuantizationType[name]))


# ---------------------------------------------------------------- round-trip error


def llama_test_data(n: int = 32 * 128) -> np.ndarray:
    """test-quantize-fns' synthetic data: 0.1 + 2 cos(i)."""
    return (0.1 + 2 * np.cos(np.arange(n, dtype=F))).astype(F)[None, :]


@pytest.mark.parametrize("name", ["Q8_0", "Q6_K", "Q5_0", "Q4_0", "Q4_K", "BF16", "F16"])
def test_round_trip_error_within_llama_cpp_bound(name):
    """test-quantize-fns' total error: sqrt(sum of squared errors) / n < 0.002."""
    x = llama_test_data()
    back = dequantize(FMT[name], qz.quantize(FMT[name], x).reshape(-1), x.shape)
    err = np.sqrt(np.sum((x.astype(np.float64) - back) ** 2)) / x.size
    assert err < 0.002


def test_q4_k_beats_q4_0_on_weights():
    """Same 4.5 bits per value; Q4_K's fitted scale and offset per 32 values lose less."""
    x = random_rows(16, 1024, seed=9)
    err = {n: np.abs(dequantize(FMT[n], qz.quantize(FMT[n], x).reshape(-1), x.shape) - x).mean()
           for n in ("Q4_0", "Q4_K", "Q8_0")}
    assert err["Q8_0"] < err["Q4_K"] < err["Q4_0"]


def test_chunks_change_nothing(monkeypatch):
    x = random_rows(6, 512, seed=11)
    whole = {n: qz.quantize(FMT[n], x) for n in ("Q8_0", "Q4_K")}
    monkeypatch.setattr(qz, "_CHUNK_VALUES", 300)  # chunks of one block, and of a partial row
    for n, blocks in whole.items():
        assert np.array_equal(qz.quantize(FMT[n], x), blocks)


# ---------------------------------------------------------------- quantize_weight and its fallback


def test_quantize_weight_multiplies_like_the_float_weight():
    w = random_rows(40, 512, seed=1)
    x = random_rows(3, 512, seed=2)
    for kind, tol in [("q8_0", 0.02), ("q4_0", 0.2), ("q4_k", 0.15), ("bf16", 0.01), ("f16", 0.002)]:
        qw = conversion.quantize_weight(w, kind)
        assert isinstance(qw, QuantizedWeight) and qw.fmt.name == qz.KINDS[kind] and qw.shape == (40, 512)
        want = x @ w.T
        got = qw.matmul(x)
        assert np.abs(got - want).max() <= tol * np.abs(want).max(), kind


def test_rows_not_whole_blocks_fall_back(caplog):
    w = random_rows(8, 576, seed=4)  # SmolLM2's hidden size: 18 blocks of 32, 2.25 of 256
    with caplog.at_level(logging.INFO, logger="nvllm.model.weights.conversion"):
        qw = conversion.quantize_weight(w, "q4_k", name="layers.0.qkv")
    assert qw.fmt.name == "Q8_0"
    assert np.array_equal(qw.blocks, qz.quantize(FMT["Q8_0"], w))
    assert "layers.0.qkv" in caplog.text and "576" in caplog.text and "Q8_0" in caplog.text
    odd = random_rows(4, 100)
    for kind in ("q4_k", "q8_0", "q4_0"):
        fmt, reason = qz.choose_format(kind, 100)
        assert fmt.name == "F32" and "100" in reason
    qw = conversion.quantize_weight(odd, "q4_0")
    assert qw.fmt.name == "F32" and np.array_equal(qw.dequantize(), odd)
    assert qz.choose_format("bf16", 577) == (FMT["BF16"], "")
    assert qz.choose_format("q4_k", 1536) == (FMT["Q4_K"], "")


def test_bad_input_is_refused_clearly():
    with pytest.raises(ValueError, match="model.quantization must be one of"):
        conversion.quantize_weight(random_rows(2, 64), "q3_k")
    with pytest.raises(ValueError, match="2-D"):
        conversion.quantize_weight(np.zeros(64, F), "q8_0", name="norm")
    with pytest.raises(ValueError, match="float32"):
        qz.quantize(FMT["Q8_0"], np.zeros((2, 64), np.float64))
    with pytest.raises(ValueError, match="multiple of its block"):
        qz.quantize(FMT["Q4_K"], np.zeros((2, 64), F))
    with pytest.raises(ValueError, match="does not quantize to Q4_1"):
        qz.quantize(FMT["Q4_1"], np.zeros((1, 32), F))
    assert qz.quantize(FMT["Q4_K"], np.zeros((0, 256), F)).shape == (0, 144)


# ---------------------------------------------------------------- the setting and its flags


def test_setting_takes_the_formats_and_refuses_others(tmp_path):
    assert load_settings().model.quantization == ""
    for kind in ("q8_0", "q4_0", "q4_k", "bf16"):
        assert load_settings(overrides={"model": {"quantization": kind}}).model.quantization == kind
        assert kind in qz.KINDS  # every value the setting takes, the quantizer takes
    with pytest.raises(ConfigError, match="model.quantization must be one of"):
        load_settings(overrides={"model": {"quantization": "q2_k"}})


@pytest.mark.parametrize("command", [["serve"], ["generate", "hi"], ["bench"]])
def test_quantization_flag(command):
    args = cli.build_parser().parse_args(command + ["--quantization", "q4_k"])
    assert args.quantization == "q4_k"
    assert cli.build_parser().parse_args(command).quantization is None


def test_serve_flag_reaches_the_settings():
    args = cli.build_parser().parse_args(["serve", "--quantization", "q8_0"])
    assert settings_from_args(args).model.quantization == "q8_0"
    args = cli.build_parser().parse_args(["serve", "--quantization", "int3"])
    with pytest.raises(ConfigError, match="model.quantization"):
        settings_from_args(args)


def test_generate_and_bench_pass_the_flag_on(monkeypatch):
    import nvllm.bench.throughput
    import nvllm.llm
    from nvllm.engine.assembly.factory import EngineBuildError

    seen = {}

    class FakeLLM:
        def __init__(self, model, **kwargs):
            seen["generate"] = kwargs.get("quantization")
            raise EngineBuildError("stop here")

    def fake_run(*args, **kwargs):
        seen["bench"] = args[8] if len(args) > 8 else kwargs.get("quantization")

    monkeypatch.setattr(nvllm.llm, "LLM", FakeLLM)
    monkeypatch.setattr(nvllm.bench.throughput, "run", fake_run)
    assert cli.main(["generate", "hi", "--quantization", "q4_0"]) == 2
    assert cli.main(["bench", "--quantization", "bf16"]) == 0
    assert seen == {"generate": "q4_0", "bench": "bf16"}
