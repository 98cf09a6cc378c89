"""model.activations: how quantized weights meet x, chosen per process by the engine that is built.

"int8" (llama.cpp's 8-bit x) is the default; "exact" is 16-bit x; "float" decodes the weights. Each is held
here to reach the kernels (the variant in use) and to change what a K-quant model computes, and the flag
to reach the settings.
"""
from __future__ import annotations

import numpy as np
import pytest

from nvllm import LLM, SamplingParams, cli
from nvllm.cli.serve import settings_from_args
from nvllm.config import ConfigError, load_settings
from nvllm.model.kernels import matmul as mk
from nvllm.model_files.synthetic.shapes import Shape
from nvllm.model_files.synthetic.writer import synthesize

needs_lib = pytest.mark.skipif(mk.lib is None, reason="the C matmul was not built (no C compiler at install)")


pytestmark = pytest.mark.usefixtures("keep_int_variant")


@pytest.fixture(scope="module")
def q4_k_model(tmp_path_factory) -> str:
    """Q4_K and Q6_K matrices (rows of 256), as llama.cpp's Q4_K_M makes them."""
    shape = Shape("act", "qwen2", 256, 512, 2, 4, 2, 64, 1024, 512, 1e6, 1e-6, "qwen2", {1000: "<|endoftext|>"},
                  bos=1000, eos=1000, bpe=1000)
    return str(synthesize(shape, "Q4_K_M", tmp_path_factory.mktemp("act") / "q4k.gguf"))


def _logits(path: str, activations: str | None) -> tuple[str, np.ndarray]:
    llm = LLM(path, num_blocks=16, max_model_len=64, activations=activations)
    out = llm.generate([{"prompt_token_ids": list(range(3, 19))}],
                       SamplingParams(max_tokens=1, temperature=0, logprobs=5))
    return mk.int_variant(), np.array([t.logprob for t in out[0].logprobs[0].top])


@needs_lib
def test_each_setting_picks_its_variant_and_changes_the_products(q4_k_model):
    runs = mk.int_variants()
    picked = {kind: _logits(q4_k_model, kind) for kind in ("exact", "int8", "float")}
    assert _logits(q4_k_model, None)[0] == picked["exact"][0]      # the default is exact
    assert picked["float"][0] == "float"
    if any(v.endswith("-i16") and v != "scalar-i16" for v in runs):
        assert picked["exact"][0].endswith("-i16") and not picked["int8"][0].endswith("-i16")
        assert not np.array_equal(picked["exact"][1], picked["int8"][1])
        # 16-bit x is far closer to the float product than 8-bit x
        assert (np.abs(picked["exact"][1] - picked["float"][1]).max()
                < np.abs(picked["int8"][1] - picked["float"][1]).max())


def test_set_activations_refuses_other_values():
    with pytest.raises(ValueError, match="model.activations must be one of exact, int8, float"):
        mk.set_activations("int4")


def test_setting_is_checked_and_the_flags_reach_it():
    with pytest.raises(ConfigError, match="activations"):
        load_settings(overrides={"model": {"activations": "int4"}})
    assert load_settings().model.activations == "exact"
    for command in (["serve"], ["generate", "hi"], ["bench"]):
        assert cli.build_parser().parse_args(command + ["--activations", "int8"]).activations == "int8"
        assert cli.build_parser().parse_args(command).activations is None
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["serve", "--activations", "int4"])
    args = cli.build_parser().parse_args(["serve", "--activations", "float"])
    assert settings_from_args(args).model.activations == "float"
