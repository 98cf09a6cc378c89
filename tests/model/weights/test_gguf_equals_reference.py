"""nvllm.model.gguf_file: a GGUF read into the same ModelConfig and weights as its HF folder (to the bit in F32,
the same logits, the published SmolLM2 GGUF against the folder converted from it, every metadata key as plain
values), and every weight type dequantized as gguf's reference does, read out to float32 or kept in place. The
GGUFs are written here from the tiny random folders (helpers/gguf_util.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from helpers import gguf_util as gu
from helpers.gguf_cases import tiny_folder
from nvllm.model.config import ModelConfig, load_config
from nvllm.model.decoder import ForwardBatch, Model
from nvllm.model.matrix.dense import DenseWeight
from nvllm.model.matrix.packed import PackedWeight
from nvllm.model.matrix.quantized import QuantizedWeight
from nvllm.model.matrix.weight import Weight
from nvllm.model.weights.folder import load_weights
from nvllm.model.weights.gguf_config import ARCHITECTURES
from nvllm.model.weights.gguf_file import read_gguf
from nvllm.model.weights.gguf_names import hf_tensor_name, unpermute_rope_rows
from nvllm.model.weights.gguf_weights import IN_PLACE_FORMATS, load_gguf_weights
from nvllm.model.weights.layout import LayerWeights, ModelWeights

FOLDERS = ("tiny-llama", "tiny-qwen2", "tiny-qwen3")
TYPES = (T.F16, T.BF16) + gu.QUANTIZABLE


@pytest.fixture(scope="module", params=FOLDERS)
def folder(request, tiny_models) -> Path:
    return tiny_folder(tiny_models, request.param)


@pytest.fixture(scope="module")
def f32_gguf(folder: Path, tmp_path_factory) -> Path:
    return gu.write_gguf(folder, tmp_path_factory.mktemp("gguf") / f"{folder.name}-f32.gguf")



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
    def dense_layer(layer: LayerWeights) -> LayerWeights:
        fields: dict[str, Any] = {k: matrix(v) if k in ("qkv", "o", "gate_up", "down") else v
                                  for k, v in vars(layer).items()}
        return LayerWeights(**fields)

    layers = [dense_layer(layer) for layer in w.layers]
    return ModelWeights(embed=embed, layers=layers, norm=w.norm, lm_head=lm_head)


def test_f32_weights_equal_the_folders_exactly(folder: Path, f32_gguf: Path):
    _, ref = load_weights(folder, quantization="f32")
    m = read_gguf(f32_gguf)
    ours = load_gguf_weights(m)
    _assert_weights_equal(ours, ref)
    assert m.mapping is not None
    mapped = np.frombuffer(m.mapping, np.uint8)
    assert not any(np.shares_memory(b, mapped) for a in [ours.embed, ours.lm_head, ours.layers[0].qkv]
                   for b in a.buffers())


def _prompt_logits(model: Model, ids: np.ndarray) -> np.ndarray:
    """Logits at every position of one prompt, prefilled in one step."""
    n, bs = len(ids), 16
    blocks = -(-n // bs)
    cache = model.make_kv_cache(blocks, bs)
    pos = np.arange(n)
    fb = ForwardBatch.build(ids, pos, pos, np.array([n]), np.array([n]), np.arange(blocks, dtype=np.int32)[None],
                            np.arange(n))
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
    assert isinstance(kept.layers[0].qkv, (QuantizedWeight, PackedWeight)) == (qtype.name in IN_PLACE_FORMATS)
    _assert_weights_equal(_dense(kept), want)
    if qtype in (T.F16, T.BF16, T.Q8_0):   # and it is still the folder's model, nearly
        _, ref = load_weights(folder, quantization="f32")
        got, near = ours.layers[0].qkv.dequantize(), ref.layers[0].qkv.dequantize()
        np.testing.assert_allclose(got, near, atol=0.02 * np.abs(near).max())


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("qtype", gu.K_QUANTS + gu.LOW_BIT + (T.Q4_0,), ids=lambda q: q.name)
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
