"""A longrope model (Phi-3) takes its short or long factors by the longest sequence the engine serves."""
from __future__ import annotations

from nvllm import LLM


def test_the_factory_sets_longrope_from_max_model_len(tiny_models):
    short = LLM(tiny_models["tiny-phi3"], num_blocks=16, max_model_len=40)   # its original context
    long = LLM(tiny_models["tiny-phi3"], num_blocks=16, max_model_len=41)
    assert (short.engine.model.long_rope, long.engine.model.long_rope) == (False, True)
    assert not LLM(tiny_models["tiny-llama"], num_blocks=16, max_model_len=2048).engine.model.long_rope
