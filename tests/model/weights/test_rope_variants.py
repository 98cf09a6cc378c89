"""Phi-3's partial rotary and longrope, and SmolLM3's NoPE layers, as config.json and a GGUF give them
(the logits themselves are held to transformers' by test_golden.py's tiny-phi3 and tiny-smollm3)."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from nvllm.model.config import ModelConfig, ModelLoadError, load_config, rope_inv_freq
from nvllm.model.decoder import Model
from nvllm.model.weights.gguf_file import read_gguf


def test_phi3_folder_reads_partial_rotary_and_longrope(tiny_models):
    c = load_config(tiny_models["tiny-phi3"])
    raw = json.loads((tiny_models["tiny-phi3"] / "config.json").read_text())
    s = c.rope_scaling
    assert (c.head_dim, c.rotary_dim, c.rope_dim) == (16, 12, 12)
    assert s is not None and s["rope_type"] == "longrope" and s["original_max_position_embeddings"] == 40
    assert s["attention_factor"] == pytest.approx(math.sqrt(1 + math.log(128 / 40) / math.log(40)))
    short, long = rope_inv_freq(c), rope_inv_freq(c, long=True)
    assert short.shape == long.shape == (6,)
    base = 1.0 / 10000.0 ** (np.arange(0, 12, 2) / 12)
    np.testing.assert_allclose(short, base / np.array(raw["rope_scaling"]["short_factor"]), rtol=1e-6)
    np.testing.assert_allclose(long, base / np.array(raw["rope_scaling"]["long_factor"]), rtol=1e-6)


def test_longrope_factors_follow_the_longest_sequence_served(tiny_models):
    model = Model.from_dir(tiny_models["tiny-phi3"])
    assert model.long_rope                     # built for its whole context, 128 > 40
    model.set_context(40)
    assert not model.long_rope
    cos_short, _ = model._rope_tables(np.arange(3))
    model.set_context(41)
    cos_long, _ = model._rope_tables(np.arange(3))
    f = model.config.rope_scaling["attention_factor"]
    np.testing.assert_allclose(cos_short[0], f, rtol=1e-6)      # position 0: cos 1, times the factor
    assert not np.allclose(cos_short[1:], cos_long[1:])


def test_the_gguf_form_reads_the_same_rope(tiny_models, tiny_ggufs):
    for name in ("tiny-phi3", "tiny-smollm3"):
        folder, gguf = load_config(tiny_models[name]), read_gguf(tiny_ggufs[name]).config
        assert (gguf.rotary_dim, gguf.nope_layers) == (folder.rotary_dim, folder.nope_layers), name
        if folder.rope_scaling is None:
            assert gguf.rope_scaling is None
            continue
        assert gguf.rope_scaling is not None and gguf.rope_scaling.keys() == folder.rope_scaling.keys()
        for key, value in folder.rope_scaling.items():
            assert gguf.rope_scaling[key] == (value if isinstance(value, str) else pytest.approx(value, rel=1e-6)), key


def _smollm3(**extra) -> dict:
    return {"architectures": ["SmolLM3ForCausalLM"], "vocab_size": 8, "hidden_size": 8, "intermediate_size": 8,
            "num_hidden_layers": 8, "num_attention_heads": 2, **extra}


def test_smollm3_nope_layers_from_the_list_or_every_fourth():
    assert ModelConfig.from_dict(_smollm3()).nope_layers == (3, 7)
    assert ModelConfig.from_dict(_smollm3(no_rope_layer_interval=3)).nope_layers == (2, 5)
    flags = [1, 0, 1, 1, 1, 1, 1, 0]
    assert ModelConfig.from_dict(_smollm3(no_rope_layers=flags)).nope_layers == (1, 7)
    with pytest.raises(ModelLoadError, match="no_rope_layers has 2 entries for 8 layers"):
        ModelConfig.from_dict(_smollm3(no_rope_layers=[1, 0]))


def test_rope_kinds_not_done_are_refused_naming_rope_scaling(tiny_models):
    cfg = json.loads((tiny_models["tiny-phi3"] / "config.json").read_text())
    cfg["rope_scaling"] = {"type": "yarn", "factor": 4.0}
    with pytest.raises(ModelLoadError, match="rope_scaling type 'yarn' is not supported"):
        ModelConfig.from_dict(cfg)
    del cfg["rope_scaling"]
    cfg["partial_rotary_factor"] = 0.2      # 3 of 16 dims: not pairs
    with pytest.raises(ModelLoadError, match="partial_rotary_factor"):
        ModelConfig.from_dict(cfg)


def test_a_longrope_gguf_without_its_original_context_is_refused_naming_the_key(tiny_models, tmp_path, monkeypatch):
    import gguf

    from helpers.gguf_util import write_gguf
    from nvllm.model.weights.gguf_reader import GGUFError

    monkeypatch.setattr(gguf.GGUFWriter, "add_rope_scaling_orig_ctx_len", lambda self, n: None)
    path = write_gguf(tiny_models["tiny-phi3"], tmp_path / "phi3.gguf")
    with pytest.raises(GGUFError, match="'phi3.rope.scaling.original_context_length' is missing"):
        read_gguf(path)


def test_a_phi3_sliding_window_shorter_than_the_context_masks_every_layer(tiny_models, tmp_path, monkeypatch):
    import gguf

    from helpers.gguf_util import write_gguf
    from helpers.schedule import run_schedule

    cfg = json.loads((tiny_models["tiny-phi3"] / "config.json").read_text())
    plain = ModelConfig.from_dict(cfg)
    assert plain.sliding_window is None and plain.max_position_embeddings == 128   # no window
    assert ModelConfig.from_dict({**cfg, "sliding_window": 4096}).sliding_window is None   # never masks
    c = ModelConfig.from_dict({**cfg, "sliding_window": 8})
    assert (c.sliding_window, c.sliding_layers, c.max_position_embeddings) == (8, [True] * c.num_layers, 128)
    # the GGUF's phi3.attention.sliding_window, read as llama.cpp does
    monkeypatch.setattr(gguf.GGUFWriter, "add_sliding_window", lambda self, n: self.add_uint32(
        "phi3.attention.sliding_window", 8))
    g = read_gguf(write_gguf(tiny_models["tiny-phi3"], tmp_path / "phi3.gguf")).config
    assert (g.sliding_window, g.sliding_layers) == (8, [True] * g.num_layers)
    # applied: past the window the logits move, and whole or token by token they agree
    ids = (np.arange(30) * 7 % 400 + 3).astype(np.int64)
    model = Model.from_dir(tiny_models["tiny-phi3"])
    (dense,) = run_schedule(model, [ids], [[30]])
    model.config = c
    (whole,), (steps,) = run_schedule(model, [ids], [[30]]), run_schedule(model, [ids], [[1]] * 30)
    np.testing.assert_allclose(whole, steps, atol=1e-4)
    np.testing.assert_allclose(whole[:8], dense[:8], atol=1e-4)
    assert np.abs(whole[8:] - dense[8:]).max() > 1e-3


def test_phi3_reads_the_same_from_the_newer_rope_parameters_form(tiny_models):
    cfg = json.loads((tiny_models["tiny-phi3"] / "config.json").read_text())
    old = ModelConfig.from_dict(cfg)
    scaling = cfg.pop("rope_scaling")
    new = {**cfg, "rope_parameters": {"rope_type": "longrope", "rope_theta": cfg.pop("rope_theta"),
                                      "partial_rotary_factor": cfg.pop("partial_rotary_factor"),
                                      "short_factor": scaling["short_factor"], "long_factor": scaling["long_factor"],
                                      "original_max_position_embeddings": 40}}
    assert ModelConfig.from_dict(new) == old
