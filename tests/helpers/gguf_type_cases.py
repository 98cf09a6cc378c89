"""The GGUFs that hold the low-bit types to transformers (tests/golden/make_golden_gguf.py writes their
goldens, tests/model/test_golden_gguf_types.py checks nvllm against them). Both sides make the files
the same way, with nvllm's quantizers, whose output is llama-quantize's byte for byte:

- SmolLM2: the shipped Q4_1 file written again in each file type (`nvllm models quantize`, as
  llama-quantize --allow-requantize). Its 576-wide rows make most tensors fall back to other types.
- tiny256: a random float32 model whose rows are multiples of 256 (helpers/gguf_util.write_random_gguf),
  written in each file type, so that every tensor can take the type itself.

A golden records each file's tensors_sha256: if the quantizers or the shipped file change, the test
says the golden is stale rather than failing on a token.
"""
from __future__ import annotations

import hashlib
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import gguf
from gguf import GGMLQuantizationType as T

from helpers.gguf_util import write_random_gguf
from nvllm.model_files.synthetic.requantize import requantize

FILE_TYPES = ("Q5_0", "IQ4_NL", "Q3_K_M", "Q2_K", "IQ4_XS")
TINY256: dict[str, Any] = {"hidden": 256, "intermediate": 512, "heads": 4, "kv_heads": 2, "layers": 2,
                           "vocab": 64, "seed": 7}
GREEDY_TOKENS = 32
TINY256_GREEDY_TOKENS = 12   # a random model's top-2 are often close: short runs keep more cases clear
# Greedy cases kept only where every step's top-1 leads the top-2 by more than this: the default
# (16-bit x) path moves logits by up to ~0.007 on these files, so a narrower lead is a coin toss.
CLEAR_MARGIN = 0.02


def tensors_sha256(path: Path) -> str:
    """sha256 over every tensor's name, type, shape and bytes, in file order (metadata left out)."""
    h = hashlib.sha256()
    for t in gguf.GGUFReader(str(path)).tensors:
        h.update(f"{t.name}:{t.tensor_type.name}:{list(t.shape)}\n".encode())
        h.update(t.data.tobytes())
    return h.hexdigest()


def smollm2_files(shipped: Path, out: Path) -> dict[str, Path]:
    """Each type written in its own process, two at a time: the K-quant searches are NumPy over 135 M weights
    (a minute of the suite one after another)."""
    targets = [out / f"smollm2-{t}.gguf" for t in FILE_TYPES]
    with ProcessPoolExecutor(max_workers=min(2, os.cpu_count() or 1),
                             mp_context=multiprocessing.get_context("spawn")) as pool:
        return dict(zip(FILE_TYPES, pool.map(requantize, [shipped] * len(FILE_TYPES), FILE_TYPES, targets)))


def tiny256_files(out: Path) -> dict[str, Path]:
    base = write_random_gguf(out / "tiny256-F32.gguf", T.F32, **TINY256)
    return {t: requantize(base, t, out / f"tiny256-{t}.gguf") for t in FILE_TYPES}
