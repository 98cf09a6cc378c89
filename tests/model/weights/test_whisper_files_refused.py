"""Hostile CTranslate2 model.bin and whisper.cpp ggml files refused cleanly, as GGUF files are
(test_gguf_refused.py): fields patched byte by byte (counts and sizes beyond the file, dimensions that overflow,
names too long, unknown types, payloads that lie), truncations, and random byte flips - each read either works
end to end or is one ModelLoadError line naming the file, never another exception or a big allocation."""
from __future__ import annotations

import resource
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from helpers.ct2_writer import write_ct2_whisper
from helpers.ggml_writer import ggml_bytes
from helpers.whisper_tensors import bpe_bytes, dims, en_tokenizer_json, tiny_tensors
from nvllm.model.config import ModelLoadError
from nvllm.model.weights.ct2_whisper import read_ct2_whisper
from nvllm.model.weights.ggml_whisper import read_ggml_whisper
from nvllm.model.weights.mapped_tensors import FileTensors

X = dims(d=32, enc=1, dec=1, heads=2)
CONFIG = {"suppress_ids": [1, 2], "suppress_ids_begin": [220, 50256], "lang_ids": [], "alignment_heads": [[0, 1]]}


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024   # Linux reports KiB


@pytest.fixture(scope="module")
def ct2(tmp_path_factory) -> Path:
    return write_ct2_whisper(tmp_path_factory.mktemp("ct2") / "tiny", tiny_tensors(X, seed=9), X,
                             en_tokenizer_json(), "float16", CONFIG)


@pytest.fixture(scope="module")
def ggml(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ggml") / "ggml-tiny.bin"
    path.write_bytes(ggml_bytes(tiny_tensors(X, seed=9), X, bpe_bytes(en_tokenizer_json()), "Q8_0"))
    return path


def _read_all(read: Callable[[Path], tuple[Any, Any, Any]], path: Path) -> None:
    """Read a file end to end: every tensor as float32, and the layout's storage of each."""
    reader, config, tok = read(path)
    assert isinstance(reader, FileTensors)
    for name, (_, _, shape) in reader.file.tensors.items():
        assert reader.array([(name, shape)]).shape == shape
        reader.get(name, shape)
    assert tok.vocab_size == config.vocab_size
    reader.close()


# ---------------------------------------------------------------- CTranslate2


def ct2_records(data: bytes) -> dict[str, dict[str, int]]:
    """Each variable's field offsets in a binary version 6 model.bin (name: its length field)."""
    pos = 4
    pos += 2 + struct.unpack_from("<H", data, pos)[0] + 4
    n = struct.unpack_from("<I", data, pos)[0]
    pos += 4
    out = {}
    for _ in range(n):
        at = pos
        length = struct.unpack_from("<H", data, pos)[0]
        name = data[pos + 2:pos + 1 + length].decode()
        pos += 2 + length
        rank = data[pos]
        rec = {"name": at, "rank": pos, "dims": pos + 1, "type": pos + 1 + 4 * rank, "nbytes": pos + 2 + 4 * rank}
        nbytes = struct.unpack_from("<I", data, rec["nbytes"])[0]
        rec["data"] = rec["nbytes"] + 4
        pos = rec["data"] + nbytes
        out[name] = rec
    out["<aliases>"] = {"count": pos, "first": pos + 4}
    return out


def _ct2_cases(data: bytes) -> dict[str, tuple[int, bytes, str]]:
    r = ct2_records(data)
    count_at = 4 + 2 + len("WhisperSpec") + 1 + 4
    bias = r["decoder/layer_0/ffn/linear_1/bias"]     # [32] float16, a 1-D variable
    fc1 = r["decoder/layer_0/ffn/linear_0/weight"]
    first = r["decoder/activation"]
    alias = r["<aliases>"]
    return {
        "binary version 7": (0, struct.pack("<I", 7), r"binary version 7 is not a CTranslate2 model nvllm reads"),
        "binary version 0": (0, struct.pack("<I", 0), r"binary version 0 is not"),
        "empty spec string": (4, struct.pack("<H", 0), r"the spec name has length 0"),
        "spec of 65534 bytes": (4, struct.pack("<H", 65535), r"the spec name is 65534 bytes long \(at most 1024\)"),
        "2**32-1 variables": (count_at, struct.pack("<I", 2**32 - 1),
                              r"claims 4294967295 variables \(nvllm reads at most 65536\)"),
        "name without its NUL": (r["decoder/alibi"]["rank"] - 1, b"x", r"does not end with a NUL"),
        "non-UTF-8 name": (first["name"] + 2, b"\xff", r"the name of variable #0 is not valid UTF-8"),
        "duplicate name": (fc1["name"] + 2 + len("decoder/layer_0/ffn/linear_"), b"1",
                           r"variable 'decoder/layer_0/ffn/linear_1/weight' appears twice"),
        "rank 200": (bias["rank"], bytes([200]), r"has rank 200 \(at most 8\)"),
        "zero dimension": (bias["dims"], struct.pack("<I", 0), r"has an empty dimension \[0\]"),
        "dimension 2**32-1": (bias["dims"], struct.pack("<I", 2**32 - 1),
                              r"64 bytes for float16 \[4294967295\], which takes 8589934590"),
        "unknown type id": (bias["type"], bytes([9]), r"has unknown type id 9 \(CTranslate2's are 0 to 5"),
        "payload that lies": (bias["nbytes"], struct.pack("<I", 66), r"66 bytes for float16 \[32\], which takes 64"),
        "2**32-1 aliases": (alias["count"], struct.pack("<I", 2**32 - 1), r"claims 4294967295 aliases"),
        "alias to nothing": (len(data) - 2, b"X", r"names 'decoder/embeddings/weighX', which the file does not hold"),
    }


CT2_CASES = ["binary version 7", "binary version 0", "empty spec string", "spec of 65534 bytes", "2**32-1 variables",
             "name without its NUL", "non-UTF-8 name", "duplicate name", "rank 200",
             "zero dimension", "dimension 2**32-1", "unknown type id", "payload that lies", "2**32-1 aliases",
             "alias to nothing"]


def _copy_folder(src: Path, dst: Path, model: bytes) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "tokenizer.json"):
        (dst / name).write_bytes((src / name).read_bytes())
    (dst / "model.bin").write_bytes(model)
    return dst


@pytest.mark.parametrize("case", CT2_CASES)
def test_hostile_model_bin_is_refused_clearly(ct2: Path, tmp_path: Path, case: str):
    data = (ct2 / "model.bin").read_bytes()
    at, new, message = _ct2_cases(data)[case]
    folder = _copy_folder(ct2, tmp_path / "bad", data[:at] + new + data[at + len(new):])
    before = _peak_rss()
    with pytest.raises(ModelLoadError, match=message) as e:
        read_ct2_whisper(folder)
    assert str(e.value).startswith(f"{folder / 'model.bin'}: ") and "\n" not in str(e.value)
    assert _peak_rss() - before < 200 << 20


def test_more_variables_than_the_file_holds(ct2: Path, tmp_path: Path):
    data = (ct2 / "model.bin").read_bytes()[:2000]
    count_at = 4 + 2 + len("WhisperSpec") + 1 + 4
    folder = _copy_folder(ct2, tmp_path / "bad", data[:count_at] + struct.pack("<I", 60000) + data[count_at + 4:])
    with pytest.raises(ModelLoadError, match=r"claims 60000 variables, more than its 2000 bytes can hold"):
        read_ct2_whisper(folder)


def test_model_bin_payload_claimed_past_the_end(ct2: Path, tmp_path: Path):
    data = bytearray((ct2 / "model.bin").read_bytes())
    rec = ct2_records(bytes(data))["decoder/layer_0/ffn/linear_1/bias"]
    struct.pack_into("<I", data, rec["dims"], 2**31 - 1)          # [2**31 - 1] float16: 2**32 - 2 bytes
    struct.pack_into("<I", data, rec["nbytes"], 2**32 - 2)
    folder = _copy_folder(ct2, tmp_path / "bad", bytes(data))
    with pytest.raises(ModelLoadError, match=r"the data of 'decoder/layer_0/ffn/linear_1/bias' needs 4294967294 "
                                             r"bytes at offset \d+ but the file ends"):
        read_ct2_whisper(folder)


def test_model_bin_truncations_are_refused(ct2: Path, tmp_path: Path):
    data = (ct2 / "model.bin").read_bytes()
    header_end = ct2_records(data)["decoder/activation"]["data"]
    cuts = sorted({0, 3, 4, 7, 20, header_end - 1, len(data) - 1, len(data) - 40}
                  | set(range(0, len(data), len(data) // 40)))
    for n in cuts:
        folder = _copy_folder(ct2, tmp_path / f"cut{n}", data[:n])
        with pytest.raises(ModelLoadError, match=r"model.bin: .*(too short|truncated)"):
            read_ct2_whisper(folder)


def test_fuzzed_model_bin_loads_or_fails_cleanly(ct2: Path, tmp_path: Path):
    data = (ct2 / "model.bin").read_bytes()
    headers = [at for rec in ct2_records(data).values() for k, at in rec.items() if k != "data"]
    rng = np.random.default_rng(4321)
    folder = _copy_folder(ct2, tmp_path / "fuzz", data)
    outcomes = {"loaded": 0, "refused": 0}
    before = _peak_rss()
    with np.errstate(all="ignore"):    # flipped float16 may be inf or NaN: a load, not an error
        for _ in range(300):
            buf = bytearray(data)
            for _ in range(int(rng.integers(1, 4))):
                at = int(rng.choice(headers)) + int(rng.integers(0, 12)) if rng.random() < 0.9 else \
                    int(rng.integers(0, len(buf)))
                at = min(at, len(buf) - 1)
                buf[at] = int(rng.integers(0, 256)) if rng.random() < 0.5 else buf[at] ^ (1 << int(rng.integers(0, 8)))
            (folder / "model.bin").write_bytes(bytes(buf))
            try:
                _read_all(read_ct2_whisper, folder)
            except ModelLoadError as e:
                assert str(folder) in str(e) and "\n" not in str(e), str(e)
                outcomes["refused"] += 1
                continue
            outcomes["loaded"] += 1
    print(f"\nfuzz: {outcomes}")
    assert outcomes["refused"] > 120 and outcomes["loaded"] > 10, outcomes
    assert _peak_rss() - before < 200 << 20


# ---------------------------------------------------------------- whisper.cpp


def ggml_records(data: bytes) -> list[dict[str, int]]:
    """Each tensor record's field offsets (n_dims, name length, type, dims, name, data)."""
    n_mel, n_fft = struct.unpack_from("<ii", data, 48)
    pos = 56 + 4 * n_mel * n_fft
    n_tokens = struct.unpack_from("<i", data, pos)[0]
    pos += 4
    for _ in range(n_tokens):
        pos += 4 + struct.unpack_from("<I", data, pos)[0]
    out = [{"vocab_end": pos}]
    while pos < len(data):
        n_dims, n_name, ttype = struct.unpack_from("<iii", data, pos)
        ne = struct.unpack_from(f"<{n_dims}i", data, pos + 12)
        rec = {"n_dims": pos, "n_name": pos + 4, "type": pos + 8, "dims": pos + 12, "name": pos + 12 + 4 * n_dims}
        rec["data"] = rec["name"] + n_name
        size = int(np.prod(ne)) * (4 if ttype == 0 else 2) if ttype in (0, 1) else int(np.prod(ne)) // 32 * 34
        pos = rec["data"] + size
        out.append(rec)
    return out


def _ggml_cases(data: bytes) -> dict[str, tuple[int, bytes, str]]:
    recs = ggml_records(data)
    vocab_at = 56 + 4 * 80 * 201
    conv_bias = recs[2]               # encoder.conv1.bias: [32, 1] F32 (recs[0] is where the vocabulary ends)
    i32 = lambda v: struct.pack("<i", v)    # noqa: E731
    return {
        "wrong magic": (0, b"GGUF", r"not a whisper.cpp model \(magic 0x46554747, expected 0x67676d6c\)"),
        "negative n_vocab": (4, i32(-5), r"hyperparameter n_vocab is -5 \(expected 1 to 1048576\)"),
        "5000 layers": (4 + 4 * 4, i32(5000), r"hyperparameter n_audio_layer is 5000 \(at most 128\)"),
        "filters of 2**40 values": (48, i32(2**20) + i32(2**20), r"mel filters of 1048576 x 1048576"),
        "2**31-1 tokens": (vocab_at, i32(2**31 - 1),
                           r"the vocabulary's token count is 2147483647 \(expected 0 to 51864\)"),
        "token of 2**32-1 bytes": (vocab_at + 4, b"\xff\xff\xff\xff", r"token 0 is 4294967295 bytes long"),
        "5 dimensions": (conv_bias["n_dims"], i32(5), r"the dimension count of the tensor at offset \d+ is 5"),
        "name of 10**6 bytes": (conv_bias["n_name"], i32(10**6), r"the name length of the tensor .* is 1000000 "
                                                                r"\(expected 1 to 256\)"),
        "unknown type": (conv_bias["type"], i32(77), r"'encoder.conv1.bias' is stored as unknown type 77"),
        "negative dimension": (conv_bias["dims"], i32(-1), r"the dimensions of the tensor at offset \d+ is -1"),
        "huge dimensions": (conv_bias["dims"], i32(2**30) + i32(2**30),
                            r"the data of tensor 'encoder.conv1.bias' \(F32 \[1073741824, 1073741824\]\) needs "
                            r"4611686018427387904 bytes"),
        "not whole blocks": (conv_bias["type"], i32(8), r"tensor 'encoder.conv1.bias': Q8_0 row length 1 is not a "
                                                        r"multiple of its block of 32 values"),
    }


GGML_CASES = ["wrong magic", "negative n_vocab", "5000 layers", "filters of 2**40 values", "2**31-1 tokens",
              "token of 2**32-1 bytes", "5 dimensions", "name of 10**6 bytes", "unknown type", "negative dimension",
              "huge dimensions", "not whole blocks"]


@pytest.mark.parametrize("case", GGML_CASES)
def test_hostile_ggml_file_is_refused_clearly(ggml: Path, tmp_path: Path, case: str):
    data = ggml.read_bytes()
    at, new, message = _ggml_cases(data)[case]
    path = tmp_path / "bad.bin"
    path.write_bytes(data[:at] + new + data[at + len(new):])
    before = _peak_rss()
    with pytest.raises(ModelLoadError, match=message) as e:
        read_ggml_whisper(path)
    assert str(e.value).startswith(f"{path}: ") and "\n" not in str(e.value)
    assert _peak_rss() - before < 200 << 20


def test_a_ggml_tensor_named_twice_is_refused(ggml: Path, tmp_path: Path):
    data = ggml.read_bytes()
    first = ggml_records(data)[1]
    record = data[first["n_dims"]:ggml_records(data)[2]["n_dims"]]
    path = tmp_path / "twice.bin"
    path.write_bytes(data + record)
    with pytest.raises(ModelLoadError, match=r"tensor 'encoder.conv1.weight' appears twice"):
        read_ggml_whisper(path)


def test_more_tensors_than_any_whisper_is_refused(ggml: Path, tmp_path: Path):
    data = ggml.read_bytes()
    tiny = b"".join(struct.pack("<iiii", 1, 6, 0, 1) + f"t{i:05d}".encode() + bytes(4) for i in range(17000))
    path = tmp_path / "many.bin"
    path.write_bytes(data + tiny)
    with pytest.raises(ModelLoadError, match=r"holds more than 16384 tensors"):
        read_ggml_whisper(path)


def test_ggml_truncations_are_refused(ggml: Path, tmp_path: Path):
    data = ggml.read_bytes()
    vocab_end = ggml_records(data)[0]["vocab_end"]
    cuts = sorted({0, 3, 4, 20, 47, 48, 60, vocab_end - 1, vocab_end + 5, len(data) - 1}
                  | set(range(0, len(data), len(data) // 40)))
    path = tmp_path / "cut.bin"
    for n in cuts:
        path.write_bytes(data[:n])
        with pytest.raises(ModelLoadError, match=r"cut.bin: .*(too short|truncated|is missing)"):
            read_ggml_whisper(path)


def test_fuzzed_ggml_files_load_or_fail_cleanly(ggml: Path, tmp_path: Path):
    """Flips mostly in the header and the tensors' records (a flip in the vocabulary or the data loads, and
    rebuilding the tokenizer takes most of a second: those are kept few)."""
    data = ggml.read_bytes()
    recs = ggml_records(data)
    targets = [*range(0, 56), *(at + k for rec in recs[1:] for f, at in rec.items() if f != "data" for k in range(4))]
    rng = np.random.default_rng(8765)
    path = tmp_path / "fuzz.bin"
    outcomes = {"loaded": 0, "refused": 0}
    before = _peak_rss()
    with np.errstate(all="ignore"):
        for _ in range(200):
            buf = bytearray(data)
            for _ in range(int(rng.integers(1, 4))):
                at = int(rng.choice(targets)) if rng.random() < 0.97 else int(rng.integers(0, len(buf)))
                buf[at] = int(rng.integers(0, 256)) if rng.random() < 0.5 else buf[at] ^ (1 << int(rng.integers(0, 8)))
            path.write_bytes(bytes(buf))
            try:
                _read_all(read_ggml_whisper, path)
            except ModelLoadError as e:
                assert str(e).startswith(f"{path}: ") and "\n" not in str(e), str(e)
                outcomes["refused"] += 1
                continue
            outcomes["loaded"] += 1
    print(f"\nfuzz: {outcomes}")
    assert outcomes["refused"] > 130 and outcomes["loaded"] >= 1, outcomes
    assert _peak_rss() - before < 200 << 20
