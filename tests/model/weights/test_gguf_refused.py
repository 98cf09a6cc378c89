"""nvllm.model.gguf_file refusing what it cannot use, with one clear line, never a crash or a big allocation:
other architectures, missing or inconsistent hyperparameters, unsupported tensor types, hostile headers
(patched byte by byte), truncations, bad alignment, a missing file, and random byte flips (each load works
end to end or is refused)."""
from __future__ import annotations

import resource
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from helpers import gguf_util as gu
from helpers.gguf_cases import rewrite_gguf
from nvllm.model.config import ModelLoadError
from nvllm.model.weights.gguf_file import GGUFModel, read_gguf
from nvllm.model.weights.gguf_reader import GGUFError
from nvllm.model.weights.gguf_weights import load_gguf_weights


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    """A small valid llama GGUF (Q8_0 matrices) for the hostile-file tests."""
    return gu.write_random_gguf(tmp_path_factory.mktemp("small") / "small.gguf", T.Q8_0, hidden=64,
                                intermediate=128, heads=4, kv_heads=2, layers=1, vocab=32)



def test_other_architectures_are_refused(tmp_path: Path):
    path = rewrite_gguf(tmp_path, extra={"general.architecture": "gemma2"})
    with pytest.raises(GGUFError, match=r"architecture 'gemma2' is not supported "
                                        r"\(supported: llama, qwen2, qwen3, phi3, smollm3, gemma3\)"):
        read_gguf(path)


def test_missing_hyperparameter_is_named(tmp_path: Path):
    with pytest.raises(GGUFError, match=r"metadata 'llama.embedding_length' is missing"):
        read_gguf(rewrite_gguf(tmp_path, drop=("llama.embedding_length",)))


def test_token_ids_must_fit_the_embedding(tmp_path: Path):
    with pytest.raises(GGUFError, match=r"'tokenizer.ggml.eos_token_id' is 32, not a token id \(0 to 31\)"):
        read_gguf(rewrite_gguf(tmp_path, extra={"tokenizer.ggml.eos_token_id": 32}))
    with pytest.raises(GGUFError, match=r"33 tokens but the embedding has 32 rows"):
        read_gguf(rewrite_gguf(tmp_path, extra={"tokenizer.ggml.tokens": [f"t{i}" for i in range(33)]}))


def test_shapes_must_match_the_hyperparameters(tmp_path: Path):
    path = rewrite_gguf(tmp_path, extra={"llama.feed_forward_length": 96})
    with pytest.raises(GGUFError, match=r"tensor 'blk.0.ffn_gate.weight' has shape \[128, 64\], expected \[96, 64\]"):
        read_gguf(path)


def test_unsupported_tensor_type_is_named(tmp_path: Path):
    path = gu.write_random_gguf(tmp_path / "iq2xxs.gguf", T.IQ2_XXS)
    with pytest.raises(GGUFError, match=r"iq2xxs.gguf: tensor 'token_embd.weight' is stored as IQ2_XXS"):
        read_gguf(path)


def _patched(small: Path, tmp_path: Path, at: int, new: bytes, name: str = "bad.gguf") -> Path:
    data = bytearray(small.read_bytes())
    data[at:at + len(new)] = new
    out = tmp_path / name
    out.write_bytes(bytes(data))
    return out


def _tensor_info_at(data: bytes, name: bytes) -> int:
    """Offset of a tensor's info record (its name's length field)."""
    return gu.find(data, struct.pack("<Q", len(name)) + name)


def _hostile_cases(small: Path) -> dict:
    data = small.read_bytes()
    first_key = 24
    arch_value = gu.find(data, b"general.architecture") + len(b"general.architecture") + 4
    tokens_len = gu.find(data, b"tokenizer.ggml.tokens") + len(b"tokenizer.ggml.tokens") + 4 + 4
    info = _tensor_info_at(data, b"blk.0.attn_k.weight")
    name_len = len(b"blk.0.attn_k.weight")
    dims_at = info + 8 + name_len + 4
    type_at = dims_at + 16
    offset_at = type_at + 4
    return {
        "wrong magic": ((0, b"GGML"), r"not a GGUF file \(magic b'GGML'"),
        "wrong version": ((4, struct.pack("<I", 7)), r"GGUF version 7 is not supported"),
        "big-endian": ((4, struct.pack(">I", 3)), r"GGUF version 50331648 is not supported"),
        "tensor count 2**60": ((8, struct.pack("<Q", 2**60)), r"claims 1152921504606846976 tensors"),
        "key count 2**60": ((16, struct.pack("<Q", 2**60)), r"claims 1152921504606846976 metadata keys"),
        "key of 2**40 bytes": ((first_key, struct.pack("<Q", 2**40)),
                               r"metadata key #0 is 1099511627776 bytes long \(at most 65535\)"),
        "string of 2**40 bytes": ((arch_value, struct.pack("<Q", 2**40)),
                                  r"metadata 'general.architecture' needs 1099511627776 bytes .* file ends"),
        "array of 2**40 strings": ((tokens_len, struct.pack("<Q", 2**40)),
                                   r"'tokenizer.ggml.tokens': array of 1099511627776 elements, but only"),
        "non-UTF-8 name": ((info + 8, b"\xff\xfe"), r"the name of tensor #\d+ is not valid UTF-8"),
        "duplicate name": ((info + 8, b"blk.0.attn_q.weight"), r"tensor 'blk.0.attn_q.weight' appears twice"),
        "zero dimension": ((dims_at, struct.pack("<Q", 0)), r"tensor 'blk.0.attn_k.weight' has an empty dimension"),
        "huge dimension": ((dims_at + 8, struct.pack("<Q", 2**62)),
                           r"tensor 'blk.0.attn_k.weight': its \d+ bytes .* past the end"),
        "unknown type": ((type_at, struct.pack("<I", 77)), r"'blk.0.attn_k.weight' is stored as unknown type 77"),
        "misaligned data": ((offset_at, struct.pack("<Q", 3)), r"data offset 3 is not a multiple of the alignment 32"),
        "data past the end": ((offset_at, struct.pack("<Q", len(data) // 32 * 32)), r"run past the end of the file"),
        "non-UTF-8 key": ((first_key + 8, b"\xc3\x28"), r"metadata key #0 is not valid UTF-8"),
        "duplicate key": ((gu.find(data, b"general.file_type"), b"llama.block_count"),
                          r"metadata key 'llama.block_count' appears twice"),
        "unknown value type": ((arch_value - 4, struct.pack("<I", 99)),
                               r"metadata 'general.architecture' has unknown value type 99"),
        "dimension count 2**31": ((info + 8 + name_len, struct.pack("<I", 2**31)), r"has 2147483648 dimensions"),
    }


HOSTILE = ["wrong magic", "wrong version", "big-endian", "tensor count 2**60", "key count 2**60",
           "key of 2**40 bytes", "string of 2**40 bytes", "array of 2**40 strings", "non-UTF-8 key",
           "duplicate key", "unknown value type", "non-UTF-8 name", "duplicate name", "zero dimension",
           "huge dimension", "dimension count 2**31", "unknown type", "misaligned data", "data past the end"]


@pytest.mark.parametrize("case", HOSTILE)
def test_hostile_header_is_refused_clearly(small: Path, tmp_path: Path, case: str):
    (at, new), message = _hostile_cases(small)[case]
    path = _patched(small, tmp_path, at, new)
    before = _peak_rss()
    with pytest.raises(GGUFError, match=message) as e:
        read_gguf(path)
    assert str(e.value).startswith(f"{path}: ") and "\n" not in str(e.value)
    assert _peak_rss() - before < 200 << 20


def test_truncations_are_refused(small: Path, tmp_path: Path):
    data = small.read_bytes()
    header_end = _data_start(small)
    cuts = sorted({0, 3, 7, 23, 24, 40, 200, header_end - 1, header_end + 1, len(data) - 1}
                  | set(range(0, header_end, max(1, header_end // 60))))
    out = tmp_path / "cut.gguf"
    for n in cuts:
        out.write_bytes(data[:n])
        with pytest.raises(GGUFError, match=r"cut.gguf: .*(too short|truncated)"):
            read_gguf(out)


def test_alignment_must_be_a_power_of_two(tmp_path: Path):
    with pytest.raises(GGUFError, match=r"general.alignment 48 is not a power of two"):
        read_gguf(rewrite_gguf(tmp_path, extra={"general.alignment": 48}))


def test_missing_file_is_a_gguf_error(tmp_path: Path):
    with pytest.raises(GGUFError, match="cannot read"):
        read_gguf(tmp_path / "nope.gguf")


def _data_start(path: Path) -> int:
    return int(gguf.GGUFReader(str(path)).data_offset)


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024   # Linux reports KiB


def test_fuzzed_files_load_or_fail_cleanly(small: Path, tmp_path: Path):
    """Random byte flips, mostly in the header: each load either works end to end or is a GGUFError /
    ModelLoadError, never another exception or a big allocation."""
    data = small.read_bytes()
    header_end = _data_start(small)
    rng = np.random.default_rng(1234)
    out = tmp_path / "fuzz.gguf"
    before = _peak_rss()
    outcomes = {"loaded": 0, "refused": 0}
    with np.errstate(all="ignore"):   # flipped scales may be NaN: a load, not an error
        _fuzz(data, header_end, rng, out, outcomes)
    print(f"\nfuzz: {outcomes}")
    assert outcomes["refused"] > 500 and outcomes["loaded"] > 50, outcomes
    assert _peak_rss() - before < 200 << 20


def _fuzz(data: bytes, header_end: int, rng: np.random.Generator, out: Path, outcomes: dict) -> None:
    for i in range(2500):
        buf = bytearray(data)
        for _ in range(int(rng.integers(1, 4))):
            at = int(rng.integers(0, header_end if rng.random() < 0.9 else len(buf)))
            buf[at] = int(rng.integers(0, 256)) if rng.random() < 0.5 else buf[at] ^ (1 << int(rng.integers(0, 8)))
        out.write_bytes(bytes(buf))
        try:
            m = read_gguf(out)
            w = load_gguf_weights(m)
        except (GGUFError, ModelLoadError) as e:
            assert str(e).startswith(f"{out}") or "tensor" in str(e), (i, str(e))
            outcomes["refused"] += 1
            continue
        assert isinstance(m, GGUFModel) and len(w.layers) == m.config.num_layers
        assert w.embed.shape == (m.config.vocab_size, m.config.hidden_size)
        outcomes["loaded"] += 1
