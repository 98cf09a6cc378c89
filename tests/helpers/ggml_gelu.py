"""ggml's GELU on the CPU, for the tests that hold nvllm's encoders to llama.cpp's outputs: with it in place of
nvllm's erf GELU, what is left between the two is float32 rounding."""
from __future__ import annotations

import math

import numpy as np


def ggml_gelu(x: np.ndarray) -> np.ndarray:
    """ggml_vec_gelu_f32: x rounded to float16, the tanh form read from a float16 table of it; 0 below -10 and x
    above 10. In place, as encoder.gelu."""
    h = x.astype(np.float16).astype(np.float32)
    c = np.float32(math.sqrt(2 / math.pi))
    y = np.float32(0.5) * h * (np.float32(1) + np.tanh(c * h * (np.float32(1) + np.float32(0.044715) * h * h)))
    x[...] = np.where(x <= -10, np.float32(0), np.where(x >= 10, x, y.astype(np.float16).astype(np.float32)))
    return x
