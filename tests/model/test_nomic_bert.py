"""NomicBert (nomic-embed-text) in model/encoder.py, from tiny-nomic-bert's folder (nomic's config keys and tensor
names) and from the nomic-bert GGUFs llama.cpp's converter wrote of it: rotary positions in place of the position
table, a SwiGLU MLP, no biases. The folder gives transformers' embeddings (its NomicBertModel, fed nomic's config:
tests/golden/pooling_tiny-nomic-bert.json), the GGUFs llama.cpp's (tests/golden/pooling_llamacpp.json, flash
attention off), the two agree; what the tiny folder does not have (rotary over part of each head, interleaved
pairs, biases) is held to a float64 NumPy reference; and what nvllm does not serve is refused by name."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from helpers.encoder_batch import encoder_batch
from helpers.paths import GOLDEN
from helpers.pooling_golden import golden_cases
from nvllm.engine.assembly.pooling_model import load_encoder_folder
from nvllm.model.config import ModelLoadError
from nvllm.model.encoder import Encoder
from nvllm.model.encoder_config import EncoderConfig
from nvllm.model.weights.gguf_encoder import load_gguf_encoder, read_gguf_encoder
from nvllm.model.weights.gguf_reader import GGUFError

CONVERTED = GOLDEN / "converted"


def gguf_encoder(name: str, in_place: bool | None = None) -> Encoder:
    return Encoder(*load_gguf_encoder(CONVERTED / f"tiny-nomic-bert.{name}.gguf", in_place)[:3])


def llamacpp_cases(name: str) -> list[dict[str, Any]]:
    runs = json.loads((GOLDEN / "pooling_llamacpp.json").read_text())["runs"]
    return next(r for r in runs if r["gguf"] == f"tiny-nomic-bert.{name}.gguf" and r["flash_attn"] == "off")["cases"]


def test_nomics_config_keys_are_read(tiny_encoders: dict[str, Path]) -> None:
    cfg = json.loads((tiny_encoders["tiny-nomic-bert"] / "config.json").read_text())
    c = EncoderConfig.from_dict(cfg)
    assert (c.architecture, c.family, c.hidden_size, c.num_layers, c.num_heads, c.intermediate_size) == (
        "NomicBertModel", "nomic-bert", 32, 2, 4, 64)
    assert (c.rotary_dim, c.rope_theta, c.rope_interleaved, c.mlp) == (8, 1000.0, False, "swiglu")
    assert not (c.attention_bias or c.up_bias or c.down_bias)
    assert (c.max_tokens, c.vocab_size, c.type_vocab_size, c.layer_norm_eps) == (2048, 960, 2, 1e-12)
    w = load_file(str(tiny_encoders["tiny-nomic-bert"] / "model.safetensors"))
    assert c.num_params == sum(a.size for a in w.values())


@pytest.mark.parametrize("change, message", [
    ({"prenorm": True}, r"prenorm True is not supported \(supported: False\)"),
    ({"rotary_scaling_factor": 2.0}, r"rotary_scaling_factor 2.0 is not supported \(supported: None\)"),
    ({"moe_every_n_layers": 2}, r"moe_every_n_layers 2 is not supported"),
    ({"activation_function": "gelu"}, r"activation_function 'gelu' is not supported \(supported: swiglu\)"),
    ({"rotary_emb_fraction": 0.375}, r"rotary_emb_fraction 0.375 gives 3 rotary values of a 8-value head"),
    ({"rotary_emb_fraction": 0.0}, r"rotary_emb_fraction 0.0 gives 0 rotary values"),
    ({"n_head": 5}, r"n_embd 32 is not a multiple of n_head 5"),
    ({"n_embd": None}, r"missing 'n_embd'"),
])
def test_what_nomics_reference_can_do_and_nvllm_does_not_is_refused(tiny_encoders: dict[str, Path],
                                                                    change: dict[str, Any], message: str) -> None:
    cfg = json.loads((tiny_encoders["tiny-nomic-bert"] / "config.json").read_text()) | change
    with pytest.raises(ModelLoadError, match=rf"^config.json: {message}"):
        EncoderConfig.from_dict(cfg)


def test_the_folder_gives_transformers_embeddings(tiny_encoders: dict[str, Path]) -> None:
    """Texts and pairs (token types 0 then 1), mean pooling and Normalize: measured within 5e-7 of transformers."""
    model, tok = load_encoder_folder(tiny_encoders["tiny-nomic-bert"], "")
    assert model.task == "embed" and model.pooling.method == "mean" and model.pooling.normalize
    assert model.weights.positions is None
    cases = golden_cases("tiny-nomic-bert")
    for c in cases:
        if c["kind"] == "text":
            assert tok.encode(c["text"]) == c["input_ids"]
        else:
            assert tok.encode_within(c["text"][0], 512, c["text"][1]) == (c["input_ids"], c["token_type_ids"])
    got = model.pool(encoder_batch([c["input_ids"] for c in cases], [c["token_type_ids"] for c in cases]))
    assert max(float(np.abs(v - c["embedding"]).max()) for v, c in zip(got, cases)) < 1e-5
    alone = model.pool(encoder_batch([cases[4]["input_ids"]], [cases[4]["token_type_ids"]]))[0]
    assert np.allclose(alone, got[4], atol=1e-6)


@pytest.mark.parametrize("name, in_place, bound", [("f32", None, 2e-6), ("f16", True, 1.5e-3), ("f16", False, 1.5e-3)])
def test_the_ggufs_give_llamacpps_embeddings_and_the_folders(tiny_encoders: dict[str, Path], name: str,
                                                             in_place: bool | None, bound: float) -> None:
    """llama.cpp's vectors (unnormalized, flash attention off) against nvllm's, both normalized: measured 6e-7 for
    the F32 file (SwiGLU's silu is exact in both: float32 rounding is all), 6e-4 for the F16 one (llama.cpp
    rounds the activations to float16 before an F16 matrix; nvllm multiplies them in float32). The folder and
    the file: cosine 1 - 1e-13 (F32), 1 - 2e-6 (F16)."""
    model = gguf_encoder(name, in_place)
    c = model.config
    assert (c.architecture, c.rotary_dim, c.rope_theta, c.mlp, c.max_tokens) == ("NomicBertModel", 8, 1000.0,
                                                                                  "swiglu", 2048)
    if in_place:
        assert model.weights.layers[0].up.formats == ("F16",) and model.weights.embed.formats == ("F16",)
    cases = llamacpp_cases(name)
    assert len(cases) == 10 and all("embedding" in x for x in cases)
    got = model.pool(encoder_batch([x["input_ids"] for x in cases]))   # token types 0, as llama.cpp's
    for v, x in zip(got, cases):
        want = np.asarray(x["embedding"])
        assert np.abs(v - want / np.linalg.norm(want)).max() < bound, x["prompt"]
    folder, _ = load_encoder_folder(tiny_encoders["tiny-nomic-bert"], "")
    same = folder.pool(encoder_batch([x["input_ids"] for x in cases]))
    assert min(float(a @ b) for a, b in zip(got, same)) >= 0.9999
    path = CONVERTED / f"tiny-nomic-bert.{name}.gguf"
    assert read_gguf_encoder(path).resident_bytes(in_place) == load_gguf_encoder(path, in_place).weights.nbytes


# ---------------------------------------------------------------- the config's other forms, against a reference

def reference(folder: Path, ids: list[int]) -> np.ndarray:
    """NomicBertModel's mean-pooled, normalized embedding in float64, as nomic's code computes it."""
    cfg = json.loads((folder / "config.json").read_text())
    w = {k: v.astype(np.float64) for k, v in load_file(str(folder / "model.safetensors")).items()}
    H, nh = cfg["n_embd"], cfg["n_head"]
    hd = H // nh
    rot = int(hd * cfg["rotary_emb_fraction"])
    inv = 1.0 / cfg["rotary_emb_base"] ** (np.arange(0, rot, 2) / rot)
    ang = np.arange(len(ids))[:, None, None] * inv
    cos, sin = np.cos(ang), np.sin(ang)

    def ln(x: np.ndarray, name: str) -> np.ndarray:
        d = x - x.mean(-1, keepdims=True)
        return d / np.sqrt((d * d).mean(-1, keepdims=True) + cfg["layer_norm_epsilon"]) * w[f"{name}.weight"] + \
            w[f"{name}.bias"]

    def linear(x: np.ndarray, name: str) -> np.ndarray:
        return x @ w[f"{name}.weight"].T + w.get(f"{name}.bias", 0.0)

    def rotate(x: np.ndarray) -> np.ndarray:
        x = x.copy()
        if cfg["rotary_emb_interleaved"]:
            a, b = x[..., 0:rot:2].copy(), x[..., 1:rot:2].copy()
            x[..., 0:rot:2], x[..., 1:rot:2] = a * cos - b * sin, b * cos + a * sin
        else:
            a, b = x[..., :rot // 2].copy(), x[..., rot // 2:rot].copy()
            x[..., :rot // 2], x[..., rot // 2:rot] = a * cos - b * sin, b * cos + a * sin
        return x

    x = ln(w["embeddings.word_embeddings.weight"][ids] + w["embeddings.token_type_embeddings.weight"][0], "emb_ln")
    for n in range(cfg["n_layer"]):
        p = f"encoder.layers.{n}."
        q, k, v = np.split(linear(x, p + "attn.Wqkv").reshape(len(ids), 3, nh, hd), 3, axis=1)
        q, k, v = rotate(q[:, 0]), rotate(k[:, 0]), v[:, 0]
        s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd)
        s = np.exp(s - s.max(-1, keepdims=True))
        o = np.einsum("hqk,khd->qhd", s / s.sum(-1, keepdims=True), v).reshape(len(ids), H)
        x = ln(x + linear(o, p + "attn.out_proj"), p + "norm1")
        gate = linear(x, p + "mlp.fc12")
        x = ln(x + linear(linear(x, p + "mlp.fc11") * gate / (1 + np.exp(-gate)), p + "mlp.fc2"), p + "norm2")
    m = x.mean(0)
    return m / np.linalg.norm(m)


@pytest.mark.parametrize("change", [
    {"rotary_emb_fraction": 0.5},
    {"rotary_emb_interleaved": True, "rotary_emb_base": 10000},
    {"qkv_proj_bias": True, "mlp_fc1_bias": True, "mlp_fc2_bias": True, "rotary_emb_fraction": 0.75},
])
def test_partial_rotary_interleaved_pairs_and_biases(tiny_encoders: dict[str, Path], tmp_path: Path,
                                                     change: dict[str, Any]) -> None:
    src = tiny_encoders["tiny-nomic-bert"]
    folder = tmp_path / "nomic"
    shutil.copytree(src, folder)
    cfg = json.loads((src / "config.json").read_text()) | change
    (folder / "config.json").write_text(json.dumps(cfg))
    w = load_file(str(src / "model.safetensors"))
    rng = np.random.default_rng(7)
    H, F = cfg["n_embd"], cfg["n_inner"]
    for n in range(cfg["n_layer"]):
        p = f"encoder.layers.{n}."
        for name, size, on in (("attn.Wqkv", 3 * H, "qkv_proj_bias"), ("attn.out_proj", H, "qkv_proj_bias"),
                               ("mlp.fc11", F, "mlp_fc1_bias"), ("mlp.fc12", F, "mlp_fc1_bias"),
                               ("mlp.fc2", H, "mlp_fc2_bias")):
            if cfg[on]:
                w[f"{p}{name}.bias"] = (0.3 * rng.standard_normal(size)).astype(np.float32)
    save_file(w, str(folder / "model.safetensors"))
    model, tok = load_encoder_folder(folder, "")
    assert model.config.num_params == sum(a.size for a in w.values())
    for text in ("The capital of France is Paris.", "Honey bees visit thousands of flowers each day."):
        ids = tok.encode(text)
        got = model.pool(encoder_batch([ids]))[0]
        assert np.abs(got - reference(folder, ids)).max() < 1e-5, text


# ---------------------------------------------------------------- refusals of a nomic-bert file

def rewrite(out: Path, extra: dict[str, int], tensors: dict[str, np.ndarray]) -> Path:
    """tiny-nomic-bert.f32.gguf written again (gguf.GGUFWriter) with uint32 keys set and tensors added."""
    reader = gguf.GGUFReader(str(CONVERTED / "tiny-nomic-bert.f32.gguf"))
    w = gguf.GGUFWriter(str(out), "nomic-bert")
    for k, f in reader.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture" or k in extra:
            continue
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_array(k, f.contents())
        else:
            w.add_key_value(k, f.contents(), f.types[0])
    for k, v in extra.items():
        w.add_uint32(k, v)
    for t in reader.tensors:
        w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    for name, data in tensors.items():
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


@pytest.mark.parametrize("extra, tensors, message", [
    ({"nomic-bert.rope.dimension_count": 3}, {}, r"metadata 'nomic-bert.rope.dimension_count' is 3: rotary "
                                                 r"positions need pairs"),
    ({"nomic-bert.rope.dimension_count": 16}, {}, r"metadata 'nomic-bert.rope.dimension_count' is 16, out of range"),
    ({}, {"blk.0.ffn_up.bias": np.zeros(64, np.float32)},
     r"unexpected tensor 'blk.0.ffn_up.bias' for a 2-layer nomic-bert model"),
    ({}, {"blk.1.attn_qkv.bias": np.zeros(96, np.float32)},
     r"unexpected tensor 'blk.1.attn_qkv.bias' for a 2-layer nomic-bert model"),
    ({}, {"position_embd.weight": np.zeros((2048, 32), np.float32)},
     r"unexpected tensor 'position_embd.weight' for a 2-layer nomic-bert model"),
])
def test_a_nomic_file_nvllm_cannot_serve_as_llamacpp_would_is_refused(
        tmp_path: Path, extra: dict[str, int], tensors: dict[str, np.ndarray], message: str) -> None:
    path = rewrite(tmp_path / "bad.gguf", extra, tensors)
    with pytest.raises(GGUFError, match=rf"^{path}: {message}"):
        load_gguf_encoder(path)
