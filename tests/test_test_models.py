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

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "models" / "make_test_models.py"
_spec = importlib.util.spec_from_file_location("make_test_models", SCRIPT)
mtm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mtm)

NAMES = ["tiny-llama", "tiny-qwen2", "tiny-llama-f16"]


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


def test_make_all_writes_the_three_folders(made: dict):
    assert sorted(made) == sorted(NAMES)
    for name, folder in made.items():
        assert folder.name == name
        for f in ("config.json", "generation_config.json", "tokenizer.json",
                  "tokenizer_config.json"):
            assert (folder / f).is_file(), (name, f)
    assert not [p for p in next(iter(made.values())).parent.iterdir() if p.name.startswith(".")]


def test_output_is_byte_identical_across_runs_and_processes(made: dict, tmp_path: Path):
    env = dict(os.environ, PYTHONHASHSEED="12345")
    env.pop("RAYON_NUM_THREADS", None)
    env.pop("TOKENIZERS_PARALLELISM", None)
    subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path)], check=True, env=env,
                   stdout=subprocess.DEVNULL)
    for name, folder in made.items():
        files = sorted(p.name for p in folder.iterdir())
        assert files == sorted(p.name for p in (tmp_path / name).iterdir())
        for f in files:
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


@pytest.mark.parametrize("name", NAMES)
def test_logits_have_a_spread_of_order_one(made: dict, name: str):
    folder = made[name]
    cfg = _json(folder / "config.json")
    w = _bf16_tensors(folder) if name == "tiny-qwen2" else \
        {k: v.astype(np.float32) for k, v in load_file(str(folder / "model.safetensors")).items()}
    emb = w["model.embed_tokens.weight"]
    head = emb if cfg["tie_word_embeddings"] else w["lm_head.weight"]
    x = emb[:50] / np.sqrt((emb[:50] ** 2).mean(-1, keepdims=True)) * w["model.norm.weight"]
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
    # The Llama folders share one tokenizer; tiny-qwen2 has its own with Qwen2's split and NFC.
    assert all(Tokenizer.from_file(str(made[n] / "tokenizer.json")).to_str() == tok.to_str()
               for n in NAMES if n != "tiny-qwen2")
    qwen = Tokenizer.from_file(str(made["tiny-qwen2"] / "tokenizer.json"))
    assert qwen.get_vocab_size() == 512 and qwen.normalizer is not None
    assert qwen.encode("    return").tokens == ["ĠĠĠ", "Ġreturn"]


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
