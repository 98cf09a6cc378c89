"""Whisper's encoder: a window's log-mel frames [n_mels, 3000] -> its states [1500, d].

Two convolutions (kernel 3, padding 1; the second of stride 2), each a matrix product over an im2col of its
input (the three taps' shifted copies side by side), so they run on the matmul kernels as every linear layer
does; exact GELU (ops.gelu_erf); the sinusoidal positions the checkpoint stores; then pre-norm layers of
bidirectional attention (BLAS on one thread a tile, the tiles shared over the kernels' thread count, the
softmax in C) and a GELU MLP; a final LayerNorm.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from nvllm.model.encoder import gelu, layer_norm
from nvllm.model.kernels import ops, threads
from nvllm.model.matrix.weight import Weight
from nvllm.model.weights.whisper_layout import Attention, Mlp, WhisperWeights
from nvllm.model.whisper_config import LAYER_NORM_EPS, WhisperConfig

TILE = 256   # query rows of a tile: its scores, [TILE, 1500], stay in cache


def im2col(x: np.ndarray, stride: int) -> np.ndarray:
    """x [frames, channels] -> [frames / stride, 3 channels]: row t holds frames stride t - 1, stride t and
    stride t + 1 (zeros past either end), the three taps of a kernel-3 convolution with padding 1."""
    frames, channels = x.shape
    padded = np.zeros((frames + 2, channels), np.float32)
    padded[1:-1] = x
    out = (frames - 1) // stride + 1
    return np.concatenate([padded[k:k + stride * out:stride] for k in range(3)], axis=1)


# Formats whose products over a window's rows go to BLAS (the packed integer ones run on the kernels' team).
BLAS_FORMATS = frozenset({"F32", "F16", "BF16"})


def linear(w: Weight, bias: np.ndarray, x: np.ndarray) -> np.ndarray:
    """x @ w.T + bias. A float matrix over many rows is shared out by rows over the kernels' thread count (BLAS
    is held to one thread in the encoder: encode_states), each part decoding w's rows for itself: the decode is
    w's size, the product the window's frames times that."""
    parts = threads.count
    if parts < 2 or x.shape[0] < 64 * parts or not set(w.formats) <= BLAS_FORMATS:
        y = w.apply(x)
    else:
        y = np.empty((x.shape[0], w.shape[0]), np.float32)
        cuts = np.linspace(0, x.shape[0], parts + 1).astype(int)
        done = [_helpers().submit(w.apply, x[a:b], y[a:b]) for a, b in zip(cuts[1:-1], cuts[2:])]
        w.apply(x[:cuts[1]], y[:cuts[1]])
        for f in done:
            f.result()
    y += bias
    return y


def encode_states(w: WhisperWeights, c: WhisperConfig, features: np.ndarray) -> np.ndarray:
    """features [n_mels, 2 * max_source_positions] float32 -> the encoder's states [max_source_positions, d]."""
    features = np.asarray(features, dtype=np.float32)
    if features.shape != (c.num_mel_bins, c.num_frames):
        raise ValueError(f"features: need [{c.num_mel_bins}, {c.num_frames}] (mel bins, frames of 30 s), got "
                         f"{list(features.shape)}")
    if not np.isfinite(features).all():
        raise ValueError("features: NaN or inf among the log-mel values")
    with threads.blas_one_thread():   # its attention shares tiles over threads of its own
        return _encode(w, c, features)


def _encode(w: WhisperWeights, c: WhisperConfig, features: np.ndarray) -> np.ndarray:
    x = gelu(linear(w.conv1, w.conv1_bias, im2col(features.T, 1)))            # [3000, d]
    x = gelu(linear(w.conv2, w.conv2_bias, im2col(x, 2)))                     # [1500, d]
    x += w.encoder_positions
    heads = c.encoder_attention_heads
    for layer in w.encoder_layers:
        x += _attention(layer.attn, layer_norm(x, layer.attn_norm, LAYER_NORM_EPS), heads)
        x += _mlp(layer.ffn, layer_norm(x, layer.ffn_norm, LAYER_NORM_EPS))
    return layer_norm(x, w.encoder_norm, LAYER_NORM_EPS)


def _attention(a: Attention, h: np.ndarray, heads: int) -> np.ndarray:
    """Every frame sees every frame: tiles of TILE query rows of one head against all its keys by BLAS, each
    tile's softmax in C (ops.softmax_causal_rows over whole rows). On 1500 frames this is 2-3x the online-softmax
    kernel of kernels/encoder_attention.py, which suits the BERT encoders' short sequences (measured at one
    thread on tiny's heads: 0.05 s against 0.10-0.16 s a layer).

    The tiles are shared out over the kernels' thread count by Python threads (BLAS lets go of the GIL), each
    taking the next tile as it finishes, with BLAS held to one thread meanwhile: OpenBLAS's own threads spin
    while they wait, and beside one other busy process on a 2-core machine a window's attention took 1.4-3.4 s
    with them against 0.73 s so (0.52 s on one thread; 0.32 s and 0.40 s on an idle machine)."""
    T, d = h.shape
    hd = d // heads
    qkv = linear(a.qkv, a.qkv_bias, h)                                        # [T, 3d]
    out = np.empty((T, d), np.float32)
    q, k, v = qkv.reshape(T, 3, heads, hd).transpose(1, 2, 0, 3)              # [heads, T, hd] each
    q = q * np.float32(hd ** -0.5)
    kt = np.ascontiguousarray(k.transpose(0, 2, 1))                           # [heads, hd, T]
    v = np.ascontiguousarray(v)
    whole = np.full(TILE, T, np.int64)
    tiles = iter([(n, t0) for n in range(heads) for t0 in range(0, T, TILE)])

    def work() -> None:
        for n, t0 in tiles:   # a shared iterator: each thread takes the next tile (next() holds the GIL)
            s = q[n, t0:t0 + TILE] @ kt[n]                                    # [rows, T]
            if ops.lib is not None:
                sums = ops.softmax_causal_rows(s, whole[:s.shape[0]])
            else:
                s -= s.max(axis=1, keepdims=True)
                np.exp(s, out=s)
                sums = s.sum(axis=1, keepdims=True)
            o = s @ v[n]
            o /= sums
            out[t0:t0 + TILE, n * hd:(n + 1) * hd] = o

    helpers = min(threads.count, heads * ((T + TILE - 1) // TILE)) - 1
    done = [_helpers().submit(work) for _ in range(helpers)]   # BLAS on one thread: encode_states
    work()
    for f in done:
        f.result()
    return linear(a.o, a.o_bias, out)


_pool: ThreadPoolExecutor | None = None


def _helpers() -> ThreadPoolExecutor:
    """The threads that share a window's attention tiles with the engine's own, made on first use."""
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(threads.MAX - 1, thread_name_prefix="nvllm-whisper")
    return _pool


def _mlp(m: Mlp, h: np.ndarray) -> np.ndarray:
    return linear(m.fc2, m.fc2_bias, gelu(linear(m.fc1, m.fc1_bias, h)))
