"""The quantizers of Q2_K and Q3_K (model/quant/quantize_k.py), IQ4_NL and IQ4_XS (quantize_iq4.py), Q5_K and
Q5_1 (quantize.py): bit for bit llama.cpp's reference quantizers (scalar transcriptions in
helpers/quant_ref.py; Q5_1 against gguf in test_quantize.py), read back by gguf as by nvllm, and within
test-quantize-fns' error bounds."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from helpers.quant_ref import (
    ref_quantize_row_iq4_nl,
    ref_quantize_row_iq4_xs,
    ref_quantize_row_q2_k,
    ref_quantize_row_q3_k,
    ref_quantize_row_q5_k,
)
from nvllm.model.quant import quantize as qz
from nvllm.model.quant.dequantize import dequantize
from nvllm.model.quant.formats import FORMATS

FMT = {f.name: f for f in FORMATS.values()}
F = np.float32
REFERENCE = {"Q2_K": ref_quantize_row_q2_k, "Q3_K": ref_quantize_row_q3_k, "Q5_K": ref_quantize_row_q5_k,
             "IQ4_NL": ref_quantize_row_iq4_nl, "IQ4_XS": ref_quantize_row_iq4_xs}


def awkward_rows(n: int) -> np.ndarray:
    """Normal weights, zeros, a constant, all negative, an outlier, values too small for a float16 scale,
    all positive, one loud sub-block beside quiet ones, heavy tails."""
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((10, n)) * 0.05).astype(F)
    x[1] = 0
    x[2] = 0.75
    x[3] = -np.abs(x[3]) - 0.01
    x[4, n // 3] = 9.0
    x[5] *= F(1e-7)
    x[6] = rng.uniform(0.2, 1.0, n)
    x[7, :16] *= 1000
    x[8] = rng.standard_t(2, n) * 0.02
    x[9, 16:48] = 0
    return x


def random_rows(rows: int, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((rows, n)) * rng.uniform(0.01, 1, (rows, 1))).astype(F)


@pytest.mark.parametrize("name", sorted(REFERENCE))
@pytest.mark.parametrize("x", [awkward_rows(512), random_rows(3, 768, seed=3)], ids=["awkward", "random"])
def test_bit_identical_to_the_reference(name: str, x: np.ndarray) -> None:
    ours = qz.quantize(FMT[name], x)
    assert ours.shape == (len(x), x.shape[1] // FMT[name].block_elems * FMT[name].block_bytes)
    for r in range(len(x)):
        assert ours[r].tobytes() == REFERENCE[name](x[r]), f"{name} row {r}"


@pytest.mark.parametrize("name", ["Q2_K", "Q3_K", "Q5_K", "Q5_1", "IQ4_NL", "IQ4_XS"])
def test_blocks_read_back_by_gguf_as_by_nvllm(name: str) -> None:
    x = random_rows(4, 512, seed=5)
    blocks = qz.quantize(FMT[name], x)
    ours = dequantize(FMT[name], blocks.reshape(-1), x.shape)
    np.testing.assert_array_equal(ours, gguf_dequantize(blocks, GGMLQuantizationType[name]))


@pytest.mark.parametrize("name, bound", [("Q2_K", 0.0075), ("Q3_K", 0.0040), ("Q5_K", 0.002), ("Q5_1", 0.002),
                                         ("IQ4_NL", 0.002), ("IQ4_XS", 0.002)])
def test_round_trip_error_within_llama_cpp_bound(name: str, bound: float) -> None:
    """test-quantize-fns' total error on its data (0.1 + 2 cos(i)), with its bounds for 2 and 3 bits."""
    x = (0.1 + 2 * np.cos(np.arange(32 * 128, dtype=F))).astype(F)[None, :]
    back = dequantize(FMT[name], qz.quantize(FMT[name], x).reshape(-1), x.shape)
    assert np.sqrt(np.sum((x.astype(np.float64) - back) ** 2)) / x.size < bound


def test_iq4_nearest_value_is_best_index_int8_at_every_edge() -> None:
    """The unit-interval lookup against the scalar binary search, on the floats either side of each
    threshold it found, on every table value, on a fine grid past both ends, and on random values."""
    from helpers.quant_ref import ref_best_index_int8
    from nvllm.model.quant import quantize_iq4

    step = quantize_iq4._UNIT_STEP[np.isfinite(quantize_iq4._UNIT_STEP)]
    assert len(step) == 15
    edges = [np.nextafter(step, F(d * np.inf)) for d in (-1, 1)]
    grid = np.arange(-140, 130, 0.125, dtype=F)
    noise = (np.random.default_rng(4).standard_normal(20000) * 70).astype(F)
    v = np.concatenate([step, *edges, quantize_iq4._VALUES, -quantize_iq4._VALUES, grid, noise]).astype(F)
    assert quantize_iq4._nearest_value(v).tolist() == [ref_best_index_int8(F(x)) for x in v]
