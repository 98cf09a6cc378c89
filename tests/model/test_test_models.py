"""models/make_test_models.py: tiny deterministic model folders for the rest of the test suite."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import jinja2
import numpy as np
import pytest
from safetensors.numpy import load_file
from tokenizers import Tokenizer

from helpers.paths import ROOT

SCRIPT = ROOT / "models" / "make_test_models.py"
_spec = importlib.util.spec_from_file_location("make_test_models", SCRIPT)
assert _spec is not None and _spec.loader is not None, SCRIPT
mtm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mtm)

NAMES = ["tiny-llama", "tiny-qwen2", "tiny-llama-f16", "tiny-qwen3", "tiny-phi3", "tiny-smollm3", "tiny-gemma3"]
ENCODERS = ["tiny-bert", "tiny-bert-cls", "tiny-bert-reranker",   # models/tiny_encoders.py
            "tiny-xlmr-reranker", "tiny-nomic-bert"]                 # models/tiny_xlmr.py, tiny_nomic.py
RERANKERS = ("tiny-bert-reranker", "tiny-xlmr-reranker")            # cross-encoders: no modules.json
QWEN = ("tiny-qwen2", "tiny-qwen3")  # bfloat16, with Qwen2's tokenizer


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict:
    return mtm.make_all(tmp_path_factory.mktemp("models"))


def _json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _header(path: Path) -> dict:
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(n))


def _dtypes(folder: Path) -> set:
    return {v["dtype"] for f in folder.glob("*.safetensors")
            for k, v in _header(f).items() if k != "__metadata__"}


def _bf16_tensors(folder: Path) -> dict:
    """Read bfloat16 safetensors (NumPy has no bf16) by widening the raw bits to float32."""
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        raw = f.read_bytes()
        n = int.from_bytes(raw[:8], "little")
        for k, v in json.loads(raw[8:8 + n]).items():
            if k == "__metadata__":
                continue
            a, b = v["data_offsets"]
            bits = np.frombuffer(raw[8 + n + a:8 + n + b], dtype=np.uint16).reshape(v["shape"])
            out[k] = (bits.astype(np.uint32) << 16).view(np.float32)
    return out


def test_make_all_writes_every_folder(made: dict):
    assert sorted(made) == sorted(NAMES + ENCODERS)
    for name, folder in made.items():
        assert folder.name == name
        # a decoder's sampling defaults; a sentence-transformers embedder's modules (a cross-encoder has neither)
        own = ("generation_config.json",) if name in NAMES else ("modules.json",) * (name not in RERANKERS)
        for f in ("config.json", "tokenizer.json", "tokenizer_config.json", *own):
            assert (folder / f).is_file(), (name, f)
    assert not [p for p in next(iter(made.values())).parent.iterdir() if p.name.startswith(".")]


def test_output_is_byte_identical_across_runs_and_processes(made: dict, tmp_path: Path):
    env = dict(os.environ, PYTHONHASHSEED="12345")
    env.pop("RAYON_NUM_THREADS", None)
    env.pop("TOKENIZERS_PARALLELISM", None)
    subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path)], check=True, env=env,
                   stdout=subprocess.DEVNULL)
    for name, folder in made.items():
        files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))   # sentence-transformers' subfolders
        assert files == sorted(str(p.relative_to(tmp_path / name)) for p in (tmp_path / name).rglob("*"))
        for f in files:
            if (folder / f).is_file():
                assert (folder / f).read_bytes() == (tmp_path / name / f).read_bytes(), (name, f)


def test_tiny_llama_config_and_weights(made: dict):
    folder = made["tiny-llama"]
    cfg = _json(folder / "config.json")
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    shape = [cfg[k] for k in ("num_hidden_layers", "hidden_size", "num_attention_heads",
                              "num_key_value_heads", "head_dim", "intermediate_size")]
    assert shape == [2, 64, 4, 2, 16, 128]
    assert cfg["rope_theta"] == 10000.0 and cfg["max_position_embeddings"] == 256
    assert cfg["rope_scaling"] == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    assert cfg["tie_word_embeddings"] is False and cfg["torch_dtype"] == "float32"
    w = load_file(str(folder / "model.safetensors"))
    assert all(a.dtype == np.float32 for a in w.values())
    assert w["lm_head.weight"].shape == (512, 64)
    assert not np.array_equal(w["lm_head.weight"], w["model.embed_tokens.weight"])
    assert w["model.layers.1.self_attn.k_proj.weight"].shape == (32, 64)
    norm = w["model.layers.0.input_layernorm.weight"]
    assert 0.05 < norm.std() < 0.2 and abs(norm.mean() - 1) < 0.1  # non-trivial norms


def test_tiny_qwen2_is_sharded_bf16_with_biases_and_new_rope_form(made: dict):
    folder = made["tiny-qwen2"]
    cfg = _json(folder / "config.json")
    assert cfg["architectures"] == ["Qwen2ForCausalLM"]
    assert cfg["rope_parameters"] == {"rope_type": "default", "rope_theta": 1000000.0}
    assert "rope_theta" not in cfg and "rope_scaling" not in cfg
    assert cfg["tie_word_embeddings"] is True and cfg["torch_dtype"] == "bfloat16"
    assert _json(folder / "generation_config.json")["eos_token_id"] == [2, 0]
    index = _json(folder / "model.safetensors.index.json")
    shards = sorted(set(index["weight_map"].values()))
    assert shards == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert _dtypes(folder) == {"BF16"}
    w = _bf16_tensors(folder)
    assert sorted(w) == sorted(index["weight_map"])
    assert index["metadata"]["total_size"] == sum(a.size * 2 for a in w.values())
    assert "lm_head.weight" not in w
    for i in range(2):
        for p in "qkv":
            b = w[f"model.layers.{i}.self_attn.{p}_proj.bias"]
            assert b.shape == ((64,) if p == "q" else (32,)) and np.abs(b).min() > 0


def test_tiny_llama_f16_is_tied_float16_plain_rope(made: dict):
    folder = made["tiny-llama-f16"]
    cfg = _json(folder / "config.json")
    assert cfg["torch_dtype"] == "float16" and cfg["tie_word_embeddings"] is True
    assert "rope_scaling" not in cfg
    w = load_file(str(folder / "model.safetensors"))
    assert {a.dtype for a in w.values()} == {np.dtype(np.float16)} and "lm_head.weight" not in w


def test_tiny_qwen3_has_head_norms_and_a_head_dim_of_its_own(made: dict):
    folder = made["tiny-qwen3"]
    cfg = _json(folder / "config.json")
    assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["model_type"] == "qwen3"
    h, nh, nkv, d = (cfg[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim"))
    assert (h, nh, nkv, d) == (64, 4, 2, 24) and nh * d != h      # q is 96 wide against a hidden size of 64
    assert cfg["attention_bias"] is False and cfg["rope_theta"] == 1000000.0 and cfg["rope_scaling"] is None
    assert cfg["tie_word_embeddings"] is True and _dtypes(folder) == {"BF16"}
    w = _bf16_tensors(folder)
    assert "lm_head.weight" not in w and not [k for k in w if k.endswith(".bias")]
    for i in range(2):
        a = f"model.layers.{i}.self_attn."
        assert w[a + "q_proj.weight"].shape == (nh * d, h) and w[a + "k_proj.weight"].shape == (nkv * d, h)
        assert w[a + "o_proj.weight"].shape == (h, nh * d)
        for norm in ("q_norm", "k_norm"):
            g = w[a + norm + ".weight"]
            assert g.shape == (d,) and 0.05 < g.std() < 0.2       # not all ones: a skipped norm shows
    assert not np.array_equal(w["model.layers.0.self_attn.q_norm.weight"], w["model.layers.0.self_attn.k_norm.weight"])


def test_the_loader_reads_tiny_qwen3(made: dict):
    from nvllm.model.weights.folder import load_weights

    config, lw = load_weights(made["tiny-qwen3"], quantization="f32")
    assert config.qk_norm and not config.attention_bias and config.head_dim == 24
    w = _bf16_tensors(made["tiny-qwen3"])
    for i, layer in enumerate(lw.layers):
        a = f"model.layers.{i}.self_attn."
        np.testing.assert_array_equal(layer.q_norm, w[a + "q_norm.weight"])
        np.testing.assert_array_equal(layer.k_norm, w[a + "k_norm.weight"])
        assert layer.qkv.shape == ((4 + 2 * 2) * 24, 64) and layer.o.shape == (64, 96) and layer.qkv_bias is None
    # The plan made from config.json alone counts the norms: every stored value, once.
    assert config.num_params == sum(a.size for a in w.values())
    assert config.weight_bytes == lw.nbytes


def test_a_missing_head_norm_is_named(made: dict, tmp_path: Path):
    from safetensors.numpy import save_file

    from nvllm.model.config import ModelLoadError
    from nvllm.model.weights.folder import load_weights

    folder = tmp_path / "tiny-qwen3"
    folder.mkdir()
    for f in made["tiny-qwen3"].glob("*.json"):
        (folder / f.name).write_bytes(f.read_bytes())
    w = _bf16_tensors(made["tiny-qwen3"])
    del w["model.layers.1.self_attn.k_norm.weight"]
    save_file(w, str(folder / "model.safetensors"))
    with pytest.raises(ModelLoadError, match=r"model\.layers\.1\.self_attn\.k_norm\.weight.*missing"):
        load_weights(folder)


def test_qwen3_config_reads_as_transformers_reads_it():
    from nvllm.model.config import ModelConfig, ModelLoadError

    base = {"architectures": ["Qwen3ForCausalLM"], "hidden_size": 64, "num_attention_heads": 4,
            "intermediate_size": 128, "num_hidden_layers": 1, "vocab_size": 10}
    c = ModelConfig.from_dict(base)
    assert c.qk_norm and not c.attention_bias
    assert c.head_dim == 128                          # Qwen3Config's default, not 64 // 4
    assert not ModelConfig.from_dict({**base, "architectures": ["Qwen2ForCausalLM"]}).qk_norm
    # attention_bias would also mean an o_proj bias, which nvllm does not carry: refused, not ignored.
    with pytest.raises(ModelLoadError, match="config.json: attention_bias true is not supported"):
        ModelConfig.from_dict({**base, "attention_bias": True})
    with pytest.raises(ModelLoadError, match="attention_bias true is not supported for LlamaForCausalLM"):
        ModelConfig.from_dict({**base, "architectures": ["LlamaForCausalLM"], "attention_bias": True})
    assert ModelConfig.from_dict({**base, "architectures": ["Qwen2ForCausalLM"]}).attention_bias  # q/k/v only


@pytest.mark.parametrize("name", NAMES)
def test_logits_have_a_spread_of_order_one(made: dict, name: str):
    folder = made[name]
    cfg = _json(folder / "config.json")
    w = _bf16_tensors(folder) if name in QWEN + ("tiny-gemma3",) else \
        {k: v.astype(np.float32) for k, v in load_file(str(folder / "model.safetensors")).items()}
    emb = w["model.embed_tokens.weight"]
    head = emb if cfg["tie_word_embeddings"] else w["lm_head.weight"]
    gain = w["model.norm.weight"] + (1.0 if name == "tiny-gemma3" else 0.0)   # Gemma's RMSNorm: 1 + w
    x = emb[:50] / np.sqrt((emb[:50] ** 2).mean(-1, keepdims=True)) * gain
    spread = (x @ head.T).std(-1)                                          # [50]
    assert 0.5 < spread.mean() < 3.0


def test_tokenizer_is_a_trained_byte_level_bpe(made: dict):
    tok = Tokenizer.from_file(str(made["tiny-llama"] / "tokenizer.json"))
    assert tok.get_vocab_size() == 512
    specials = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
    assert [tok.token_to_id(t) for t in specials] == [0, 1, 2]
    # merges were learned
    assert tok.encode("The dog and the").tokens == ["The", "Ġdog", "Ġand", "Ġthe"]
    assert tok.encode("What is 123?").tokens[-4:] == ["1", "2", "3", "?"]
    texts = ("Hello, world!", "Größe 東京 🚀 ñ", "def f(x):\n    return x * 2\n", "ZQX")
    for text in texts:
        assert tok.decode(tok.encode(text).ids) == text
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>").ids
    assert ids[0] == 1 and ids[-1] == 2
    # The Llama folders share one tokenizer; the Qwen ones share another with Qwen2's split and NFC.
    assert all(Tokenizer.from_file(str(made[n] / "tokenizer.json")).to_str() == tok.to_str()
               for n in NAMES if n not in QWEN)
    qwen = Tokenizer.from_file(str(made["tiny-qwen2"] / "tokenizer.json"))
    assert qwen.get_vocab_size() == 512 and qwen.normalizer is not None
    assert qwen.encode("    return").tokens == ["ĠĠĠ", "Ġreturn"]
    assert Tokenizer.from_file(str(made["tiny-qwen3"] / "tokenizer.json")).to_str() == qwen.to_str()


def test_chat_template_is_chatml_with_default_system(made: dict):
    for name in NAMES:
        cfg = _json(made[name] / "tokenizer_config.json")
        assert cfg["eos_token"] == "<|im_end|>"
        t = jinja2.Template(cfg["chat_template"])
        text = t.render(messages=[{"role": "user", "content": "Hi"}], add_generation_prompt=True)
        assert text == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
        text = t.render(messages=[{"role": "system", "content": "Be brief."},
                                  {"role": "user", "content": "Hi"},
                                  {"role": "assistant", "content": "Hello"}],
                        add_generation_prompt=False)
        assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                        "<|im_start|>assistant\nHello<|im_end|>\n")


def test_only_option_makes_one_folder(tmp_path: Path):
    mtm.main(["--out", str(tmp_path), "--only", "tiny-qwen2"])
    assert [p.name for p in tmp_path.iterdir()] == ["tiny-qwen2"]


def test_each_tiny_gguf_names_its_tensors_as_llama_cpp_does(tiny_ggufs):
    # gguf's table is llama.cpp's own: a name only nvllm reads would hide a reader that is wrong the same way.
    import gguf

    from nvllm.model.weights.gguf_file import read_gguf

    for name, path in tiny_ggufs.items():
        m = read_gguf(path)
        arch = next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == m.metadata["general.architecture"])
        known = {gguf.TENSOR_NAMES[t].format(bid=i) for t in gguf.MODEL_TENSORS[arch]
                 for i in range(m.config.num_layers)} | {"rope_freqs", "rope_factors_long", "rope_factors_short"}
        extra = [t for t in m.tensors if t.rsplit(".", 1)[0] not in known]
        assert extra == [], f"{name}: {extra}"
