"""nvllm.model.gguf_file: a GGUF read into the same ModelConfig and weights as its HF folder, every weight
type dequantized as gguf's reference does, and hostile files refused with one clear line, never a crash or
a big allocation. The GGUFs are written here from the tiny random folders (tests/gguf_util.py)."""
from __future__ import annotations

import resource
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

import gguf_util as gu
from nvllm.model.config import ModelConfig, ModelLoadError, load_config
from nvllm.model.decoder import ForwardBatch, Model
from nvllm.model.matrix.dense import DenseWeight
from nvllm.model.matrix.quantized import QuantizedWeight
from nvllm.model.matrix.weight import Weight
from nvllm.model.weights.folder import load_weights
from nvllm.model.weights.gguf_config import ARCHITECTURES
from nvllm.model.weights.gguf_file import GGUFModel, read_gguf
from nvllm.model.weights.gguf_names import hf_tensor_name, unpermute_rope_rows
from nvllm.model.weights.gguf_reader import GGUFError
from nvllm.model.weights.gguf_weights import IN_PLACE_FORMATS, load_gguf_weights
from nvllm.model.weights.layout import LayerWeights, ModelWeights

FOLDERS = ("tiny-llama", "tiny-qwen2", "tiny-qwen3")
TYPES = (T.F16, T.BF16) + gu.QUANTIZABLE


def _folder(tiny_models: dict, name: str) -> Path:
    path = tiny_models.get(name, Path(__file__).resolve().parent.parent / "models" / name)
    if not (path / "config.json").exists():
        pytest.skip(f"{name} is not made by models/make_test_models.py yet")
    return path


@pytest.fixture(scope="module", params=FOLDERS)
def folder(request, tiny_models) -> Path:
    return _folder(tiny_models, request.param)


@pytest.fixture(scope="module")
def f32_gguf(folder: Path, tmp_path_factory) -> Path:
    return gu.write_gguf(folder, tmp_path_factory.mktemp("gguf") / f"{folder.name}-f32.gguf")


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    """A small valid llama GGUF (Q8_0 matrices) for the hostile-file tests."""
    return gu.write_random_gguf(tmp_path_factory.mktemp("small") / "small.gguf", T.Q8_0, hidden=64,
                                intermediate=128, heads=4, kv_heads=2, layers=1, vocab=32)


# ---------------------------------------------------------------- same as the folder

def test_config_equals_the_folders(folder: Path, f32_gguf: Path):
    assert read_gguf(f32_gguf).config == load_config(folder)


def _assert_same(y, x, name: str) -> None:
    """A vector float32 and C-contiguous, a matrix a DenseWeight of a C-contiguous float32 [out, in] (the
    folder's layout), holding the values of x."""
    if isinstance(x, Weight):
        assert isinstance(y, DenseWeight) and y.shape == x.shape, name
        y, x = y.array, x.dequantize()
    assert y.shape == x.shape and y.dtype == np.float32 and y.flags.c_contiguous, name
    np.testing.assert_array_equal(y, x, err_msg=name)


def _assert_weights_equal(ours: ModelWeights, ref: ModelWeights) -> None:
    _assert_same(ours.embed, ref.embed, "embed")
    _assert_same(ours.norm, ref.norm, "norm")
    _assert_same(ours.lm_head, ref.lm_head, "lm_head")
    assert ours.lm_head.shares_memory(ours.embed) == ref.lm_head.shares_memory(ref.embed)
    assert len(ours.layers) == len(ref.layers)
    for a, b in zip(ours.layers, ref.layers):
        for name, x in vars(b).items():
            y = getattr(a, name)
            if x is None:
                assert y is None, name
            else:
                _assert_same(y, x, name)


def _dense(w: ModelWeights) -> ModelWeights:
    """Weights kept in their format (load_gguf_weights in place) in the float32 layout: the values they
    multiply by, for comparing with a folder's or gguf's reference."""
    def matrix(x: Weight) -> DenseWeight:
        return DenseWeight(np.ascontiguousarray(x.dequantize()))

    embed = matrix(w.embed)
    lm_head = embed if w.lm_head is w.embed else matrix(w.lm_head)
    layers = [LayerWeights(**{k: matrix(v) if k in ("qkv", "o", "gate_up", "down") else v
                              for k, v in vars(layer).items()}) for layer in w.layers]
    return ModelWeights(embed=embed, layers=layers, norm=w.norm, lm_head=lm_head)


def test_f32_weights_equal_the_folders_exactly(folder: Path, f32_gguf: Path):
    _, ref = load_weights(folder, quantization="f32")
    m = read_gguf(f32_gguf)
    ours = load_gguf_weights(m)
    _assert_weights_equal(ours, ref)
    mapped = np.frombuffer(m.mapping, np.uint8)
    assert not any(np.shares_memory(b, mapped) for a in [ours.embed, ours.lm_head, ours.layers[0].qkv]
                   for b in a.buffers())


def _prompt_logits(model: Model, ids: np.ndarray) -> np.ndarray:
    """Logits at every position of one prompt, prefilled in one step."""
    n, bs = len(ids), 16
    blocks = -(-n // bs)
    cache = model.make_kv_cache(blocks, bs)
    pos = np.arange(n)
    fb = ForwardBatch.build(ids, pos, pos, [n], [n], np.arange(blocks, dtype=np.int32)[None], np.arange(n))
    return model.forward(fb, cache)


def test_f32_logits_equal_the_folder_models(folder: Path, f32_gguf: Path):
    m = read_gguf(f32_gguf)
    ids = np.array([1, 57, 300, 12, 9, 250, 77, 2, 3, 4, 5, 100, 200, 311, 45, 6, 8, 19], dtype=np.int64)
    ours = _prompt_logits(Model(m.config, load_gguf_weights(m)), ids)
    ref = _prompt_logits(Model.from_dir(folder, "f32"), ids)
    np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-4)


@pytest.mark.smollm2
def test_the_published_smollm2_gguf_equals_its_converted_folder(smollm2: Path):
    """A real llama.cpp file (Q4_1 and Q8_0 matrices): the same config and, to the bit, the same weights
    as the folder gguf_convert made from it with gguf's own reader and dequantizer."""
    path = smollm2.parent / f"{smollm2.name}.gguf"
    if not path.exists():
        pytest.skip(f"{path} is not kept by this pull")
    m = read_gguf(path)
    config, ref = load_weights(smollm2, quantization="f32")
    assert m.config == config
    assert {f.name for f, _, _ in m.tensors.values()} >= {"Q4_1", "F32"}
    _assert_weights_equal(load_gguf_weights(m, in_place=False), ref)
    _assert_weights_equal(_dense(load_gguf_weights(m, in_place=True)), ref)


def test_metadata_is_every_key_as_plain_values(f32_gguf: Path):
    m = read_gguf(f32_gguf)
    reader = gguf.GGUFReader(str(f32_gguf))
    want = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert m.metadata == want
    assert isinstance(m.metadata["tokenizer.ggml.tokens"], list)
    assert m.metadata["tokenizer.ggml.model"] == "gpt2"
    assert {t.name for t in reader.tensors} == set(m.tensors)
    for t in reader.tensors:   # the raw bytes are views of the same file region
        fmt, raw, shape = m.tensors[t.name]
        assert fmt.ggml_type == int(t.tensor_type) and raw.dtype == np.uint8 and not raw.flags.owndata
        assert shape == tuple(reversed([int(n) for n in t.shape]))
        assert raw.tobytes() == t.data.tobytes()


# ---------------------------------------------------------------- each weight type

def _reference(path: Path, config: ModelConfig, arch: str) -> ModelWeights:
    """gguf.quants.dequantize of every tensor, Q/K rows unpermuted for llama, laid out by hand."""
    t = {hf_tensor_name(n): a for n, a in gu.gguf_dequantized(path).items() if n != "rope_freqs.weight"}
    c = config
    if arch == "llama":
        for n in list(t):
            if ".q_proj." in n:
                t[n] = unpermute_rope_rows(t[n], c.num_heads)
            elif ".k_proj." in n:
                t[n] = unpermute_rope_rows(t[n], c.num_kv_heads)
    layers = []
    for i in range(c.num_layers):
        p, a = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
        bias = (np.concatenate([t[a + f"{x}_proj.bias"] for x in "qkv"]) if c.attention_bias else None)
        layers.append(LayerWeights(
            input_norm=t[p + "input_layernorm.weight"],
            qkv=DenseWeight(np.concatenate([t[a + f"{x}_proj.weight"] for x in "qkv"])),
            qkv_bias=bias,
            o=DenseWeight(t[a + "o_proj.weight"]),
            post_norm=t[p + "post_attention_layernorm.weight"],
            gate_up=DenseWeight(np.concatenate([t[p + "mlp.gate_proj.weight"], t[p + "mlp.up_proj.weight"]])),
            down=DenseWeight(t[p + "mlp.down_proj.weight"]),
            q_norm=t.get(a + "q_norm.weight"), k_norm=t.get(a + "k_norm.weight"),
        ))
    embed = DenseWeight(t["model.embed_tokens.weight"])
    lm_head = embed if c.tie_word_embeddings else DenseWeight(t["lm_head.weight"])
    return ModelWeights(embed=embed, layers=layers, norm=t["model.norm.weight"], lm_head=lm_head)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_each_type_equals_ggufs_dequantize(folder: Path, qtype: T, tmp_path: Path):
    path = gu.write_gguf(folder, tmp_path / f"{qtype.name}.gguf", qtype)
    m = read_gguf(path)
    assert m.tensors["blk.0.ffn_up.weight"][0].name == qtype.name
    want = _reference(path, m.config, m.metadata["general.architecture"])
    ours = load_gguf_weights(m, in_place=False)
    _assert_weights_equal(ours, want)
    kept = load_gguf_weights(m, in_place=True)   # in the file's format: the same values, in place
    assert isinstance(kept.layers[0].qkv, QuantizedWeight) == (qtype.name in IN_PLACE_FORMATS)
    _assert_weights_equal(_dense(kept), want)
    if qtype in (T.F16, T.BF16, T.Q8_0):   # and it is still the folder's model, nearly
        _, ref = load_weights(folder, quantization="f32")
        got, near = ours.layers[0].qkv.dequantize(), ref.layers[0].qkv.dequantize()
        np.testing.assert_allclose(got, near, atol=0.02 * np.abs(near).max())


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("qtype", gu.K_QUANTS + (T.Q4_0,), ids=lambda q: q.name)
def test_random_blocks_equal_ggufs_dequantize(arch: str, qtype: T, tmp_path: Path):
    path = gu.write_random_gguf(tmp_path / "r.gguf", qtype, arch, tied=arch == "qwen2", seed=int(qtype))
    m = read_gguf(path)
    c = m.config
    assert (c.architecture, c.hidden_size, c.intermediate_size, c.num_heads, c.num_kv_heads, c.head_dim,
            c.vocab_size, c.num_layers) == (ARCHITECTURES[arch], 256, 512, 4, 2, 64, 64, 1)
    assert c.attention_bias == (arch == "qwen2") and c.qk_norm == (arch == "qwen3")
    assert c.tie_word_embeddings == (arch == "qwen2") and c.eos_token_ids == [63]
    want = _reference(path, c, arch)
    ours = load_gguf_weights(m, in_place=False)
    _assert_weights_equal(ours, want)
    assert all(np.isfinite(layer.qkv.dequantize()).all() for layer in ours.layers)
    _assert_weights_equal(_dense(load_gguf_weights(m, in_place=True)), want)


# ---------------------------------------------------------------- rope scaling

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
    data = _rewrite(tmp_path, extra={"llama.rope.scaling.type": "llama3", "llama.rope.scaling.factor": 8.0,
                                     "llama.rope.scaling.original_context_length": 64,
                                     "llama.rope.scaling.high_freq_factor": 2.0})
    c = read_gguf(data).config
    assert c.rope_scaling == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 2.0, "original_max_position_embeddings": 64}


def test_unsupported_rope_scaling_is_refused(tmp_path: Path):
    path = _rewrite(tmp_path, extra={"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0})
    with pytest.raises(GGUFError, match=r"rope scaling type 'yarn' is not supported"):
        read_gguf(path)


def test_rope_freqs_that_are_not_llama3_are_refused(tiny_models, tmp_path: Path):
    folder = _folder(tiny_models, "tiny-llama")
    path = gu.write_gguf(folder, tmp_path / "l.gguf")
    data = bytearray(path.read_bytes())
    m = read_gguf(path)
    raw = m.tensors["rope_freqs.weight"][1]
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


def _rewrite(tmp_path: Path, extra: dict | None = None, drop: tuple = (), arch: str = "llama",
             qtype: T = T.F32) -> Path:
    """A small random GGUF written again with keys added or dropped (GGUFWriter, not byte surgery)."""
    src = gu.write_random_gguf(tmp_path / "src.gguf", qtype, arch, hidden=64, intermediate=128, vocab=32)
    reader = gguf.GGUFReader(str(src))
    extra = dict(extra or {})
    out = tmp_path / "rewritten.gguf"
    w = gguf.GGUFWriter(str(out), extra.pop("general.architecture", arch))
    for k, f in reader.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture" or k in drop or k in extra:
            continue
        vtype = f.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_array(k, f.contents())
        else:
            w.add_key_value(k, f.contents(), vtype)
    for k, v in extra.items():
        if isinstance(v, list):
            w.add_array(k, v)
        elif isinstance(v, str):
            w.add_string(k, v)
        elif isinstance(v, float):
            w.add_float32(k, v)
        else:
            w.add_uint32(k, v)
    for t in reader.tensors:
        w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    return gu._finish(w, out)


# ---------------------------------------------------------------- refused, clearly

def test_other_architectures_are_refused(tmp_path: Path):
    path = _rewrite(tmp_path, extra={"general.architecture": "gemma2"})
    with pytest.raises(GGUFError, match=r"architecture 'gemma2' is not supported \(supported: llama, qwen2, qwen3\)"):
        read_gguf(path)


def test_missing_hyperparameter_is_named(tmp_path: Path):
    with pytest.raises(GGUFError, match=r"metadata 'llama.embedding_length' is missing"):
        read_gguf(_rewrite(tmp_path, drop=("llama.embedding_length",)))


def test_token_ids_must_fit_the_embedding(tmp_path: Path):
    with pytest.raises(GGUFError, match=r"'tokenizer.ggml.eos_token_id' is 32, not a token id \(0 to 31\)"):
        read_gguf(_rewrite(tmp_path, extra={"tokenizer.ggml.eos_token_id": 32}))
    with pytest.raises(GGUFError, match=r"33 tokens but the embedding has 32 rows"):
        read_gguf(_rewrite(tmp_path, extra={"tokenizer.ggml.tokens": [f"t{i}" for i in range(33)]}))


def test_shapes_must_match_the_hyperparameters(tmp_path: Path):
    path = _rewrite(tmp_path, extra={"llama.feed_forward_length": 96})
    with pytest.raises(GGUFError, match=r"tensor 'blk.0.ffn_gate.weight' has shape \[128, 64\], expected \[96, 64\]"):
        read_gguf(path)


def test_unsupported_tensor_type_is_named(tmp_path: Path):
    path = gu.write_random_gguf(tmp_path / "q2k.gguf", T.Q2_K)
    with pytest.raises(GGUFError, match=r"q2k.gguf: tensor 'token_embd.weight' is stored as Q2_K"):
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
        read_gguf(_rewrite(tmp_path, extra={"general.alignment": 48}))


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
