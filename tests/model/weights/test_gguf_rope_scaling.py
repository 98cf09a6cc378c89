"""nvllm.model.gguf_file's rope scaling: llama3 scaling recovered from the rope_freqs divisors llama.cpp writes
(Llama 3.1's and 3.2's parameters come back) or read from its metadata keys; other scaling types, and
rope_freqs that are not a llama3 curve, refused."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from helpers import gguf_util as gu
from helpers.gguf_cases import rewrite_gguf, tiny_folder
from nvllm.model.weights.gguf_file import read_gguf
from nvllm.model.weights.gguf_reader import GGUFError


@pytest.mark.parametrize("scaling", [
    {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
], ids=["llama-3.2", "llama-3.1"])
def test_llama3_scaling_is_recovered_from_rope_freqs(scaling: dict, tmp_path: Path):
    """llama.cpp writes llama3 scaling as per-frequency divisors only: Llama 3.x's parameters come back."""
    path = gu.write_random_gguf(tmp_path / "l3.gguf", T.F32, context=131072, rope_theta=500000.0,
                                rope_scaling=scaling)
    assert read_gguf(path).config.rope_scaling == {"rope_type": "llama3", **scaling}


def test_llama3_scaling_from_metadata_keys(tmp_path: Path):
    """rope.scaling.type llama3 with its parameters as keys is read as such (no rope_freqs tensor)."""
    data = rewrite_gguf(tmp_path, extra={"llama.rope.scaling.type": "llama3", "llama.rope.scaling.factor": 8.0,
                                     "llama.rope.scaling.original_context_length": 64,
                                     "llama.rope.scaling.high_freq_factor": 2.0})
    c = read_gguf(data).config
    assert c.rope_scaling == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 2.0, "original_max_position_embeddings": 64}


def test_unsupported_rope_scaling_is_refused(tmp_path: Path):
    path = rewrite_gguf(tmp_path, extra={"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0})
    with pytest.raises(GGUFError, match=r"rope scaling type 'yarn' is not supported"):
        read_gguf(path)


def test_rope_freqs_that_are_not_llama3_are_refused(tiny_models, tmp_path: Path):
    folder = tiny_folder(tiny_models, "tiny-llama")
    path = gu.write_gguf(folder, tmp_path / "l.gguf")
    data = bytearray(path.read_bytes())
    m = read_gguf(path)
    raw = m.tensors["rope_freqs.weight"][1]
    assert m.mapping is not None
    at = raw.__array_interface__["data"][0] - np.frombuffer(m.mapping, np.uint8, count=0).__array_interface__["data"][0]
    freqs = np.frombuffer(bytes(data[at:at + raw.size]), np.float32).copy()
    freqs[::-1].sort()   # decreasing: no llama3 curve has that
    freqs[0] = 3.0
    data[at:at + raw.size] = freqs.tobytes()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    del m
    with pytest.raises(GGUFError, match="rope_freqs.weight"):
        read_gguf(bad)
