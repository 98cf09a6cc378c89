"""Gemma 3's configuration, from a folder's config.json in each form transformers has written (layer_types
and rope_parameters per layer type; or sliding_window_pattern, rope_theta, rope_local_base_freq and
rope_scaling) and from a GGUF read as llama.cpp's loader reads it; what is not supported is refused."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from helpers.schedule import run_schedule
from nvllm import LLM, SamplingParams
from nvllm.model.config import ModelConfig, ModelLoadError, layer_rope, rope_inv_freq
from nvllm.model.decoder import Model
from nvllm.model.weights.gguf_file import read_gguf
from nvllm.model_files.synthetic.shapes import SHAPES
from nvllm.model_files.synthetic.writer import synthesize

BASE = {"architectures": ["Gemma3ForCausalLM"], "hidden_size": 64, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 128, "num_hidden_layers": 7,
        "vocab_size": 512}


def test_the_older_form_gives_the_pattern_and_both_ropes():
    c = ModelConfig.from_dict({**BASE, "sliding_window_pattern": 3, "sliding_window": 16, "rope_theta": 5e5,
                               "rope_local_base_freq": 2e4, "rope_scaling": {"rope_type": "linear", "factor": 8.0},
                               "query_pre_attn_scalar": 64})
    assert c.sliding_layers == [True, True, False, True, True, False, True]
    assert (c.sliding_window, c.rope_theta, c.rope_local_theta) == (16, 5e5, 2e4)
    assert c.tie_word_embeddings and c.qk_norm and c.post_norms and c.norm_offset == 1.0 and c.embed_scale == 8.0
    base = 5e5 ** -(np.arange(0, 32, 2, dtype=np.float32) / 32)
    np.testing.assert_allclose(rope_inv_freq(c), base / 8, rtol=1e-6)                 # global: linear, factor 8
    np.testing.assert_allclose(rope_inv_freq(layer_rope(c, True)), 2e4 ** -(np.arange(0, 32, 2) / 32), rtol=1e-6)
    assert Model(c, None).scale == 64 ** -0.5   # type: ignore[arg-type]  # query_pre_attn_scalar's, not head_dim's


def test_rope_parameters_per_layer_type_and_the_defaults():
    c = ModelConfig.from_dict({**BASE, "layer_types": ["full_attention"] + ["sliding_attention"] * 6,
                               "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                                   "sliding_attention": {"rope_type": "default",
                                                                         "rope_theta": 1e4}}})
    assert c.sliding_layers == [False] + [True] * 6 and c.rope_scaling is None
    assert (c.rope_theta, c.rope_local_theta, c.sliding_window, c.query_pre_attn_scalar) == (1e6, 1e4, 4096, 256)
    assert c.final_logit_softcapping is None


@pytest.mark.parametrize("extra,match", [
    ({"use_bidirectional_attention": True}, "bidirectional"),
    ({"hidden_activation": "silu"}, "hidden_activation"),
    ({"layer_types": ["sliding_attention"] * 3}, "layer_types"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope type"),
])
def test_what_is_not_supported_is_refused(extra, match):
    with pytest.raises(ModelLoadError, match=match):
        ModelConfig.from_dict({**BASE, **extra})


def test_the_gguf_is_read_as_llama_cpp_reads_it(tiny_ggufs, tiny_models):
    g = read_gguf(tiny_ggufs["tiny-gemma3"])
    c = g.config
    assert c.architecture == "Gemma3ForCausalLM" and c.num_layers == 6
    assert c.sliding_layers == [True] * 5 + [False] and c.sliding_window == 8   # every 6th layer global
    assert c.query_pre_attn_scalar == c.head_dim == 32 and c.rope_local_theta == 10000.0
    assert c.rope_scaling == {"rope_type": "linear", "factor": 8.0} and c.norm_offset == 0.0
    assert Model(c, None).scale == Model.from_dir(tiny_models["tiny-gemma3"]).scale   # type: ignore[arg-type]


def test_final_logit_softcapping_caps_the_logits(tiny_models):
    model = Model.from_dir(tiny_models["tiny-gemma3"])
    ids = np.arange(3, 20)
    plain = run_schedule(model, [ids], [[len(ids)]])[0]
    model.config.final_logit_softcapping = 0.5
    capped = run_schedule(model, [ids], [[len(ids)]])[0]
    np.testing.assert_allclose(capped, np.tanh(plain / 0.5) * 0.5, atol=1e-6)


def test_a_synthesized_gemma3_reads_back_and_generates(tmp_path):
    """`nvllm models synthesize`'s gemma3 files, on a small copy of gemma-3-270m's shape."""
    small = dataclasses.replace(SHAPES["gemma-3-270m"], name="tiny-gemma-3", hidden=128, intermediate=256, layers=6,
                                head_dim=64, vocab=1280, specials={1024: "<bos>", 1025: "<end_of_turn>"}, bos=1024,
                                eos=1025, bpe=1024, bpe_start=0, sliding_window=8)
    path = synthesize(small, "Q8_0", tmp_path / "g.gguf")
    c = read_gguf(path).config
    assert c.sliding_layers == [True] * 5 + [False] and c.sliding_window == 8 and c.post_norms
    llm = LLM(str(path), num_blocks=32, max_model_len=64)
    out = llm.generate(["Where is the drone? " * 3], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    assert len(out[0].token_ids) == 4


def test_attention_softcapping_agrees_however_the_tokens_come(tiny_models, kernel_path):
    """Gemma 2's attn_logit_softcapping, honoured if a config sets it: the NumPy decode and the prefill
    (whose C softmax takes the capped scores) agree, chunked or token by token; a cap moves the logits."""
    model = Model.from_dir(tiny_models["tiny-gemma3"])
    ids = np.arange(3, 40)
    plain = run_schedule(model, [ids], [[len(ids)]])[0]
    model.config.attn_logit_softcapping = 0.3
    whole = run_schedule(model, [ids], [[len(ids)]])[0]
    np.testing.assert_allclose(run_schedule(model, [ids], [[1]] * len(ids))[0], whole, atol=1e-4)
    np.testing.assert_allclose(run_schedule(model, [ids], [[7]] * 5 + [[2]])[0], whole, atol=1e-4)
    assert np.abs(whole - plain).max() > 1e-2
