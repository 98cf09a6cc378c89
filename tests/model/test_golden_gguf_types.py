"""The low-bit GGUF types against transformers' GGUF loader (goldens by tests/golden/make_golden_gguf.py):
the files llama-quantize makes of SmolLM2 and of tiny256 (rows of 256) in Q5_0, IQ4_NL, Q3_K_M, Q2_K
and IQ4_XS, remade here by nvllm's own quantizers (helpers/gguf_type_cases.py), load with each type in
place and give transformers' logits (tiny256, within 1e-3, exact float path, both kernel paths) and its
greedy tokens (activations "exact", KV cache f32)."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from helpers.gguf_type_cases import FILE_TYPES, smollm2_files, tensors_sha256, tiny256_files
from helpers.paths import GOLDEN
from helpers.schedule import run_schedule
from nvllm import LLM, SamplingParams
from nvllm.model.decoder import Model
from nvllm.model.matrix.weight import Weight
from nvllm.model.weights.gguf_file import read_gguf
from nvllm.model.weights.gguf_weights import load_gguf_weights

TOL = 1e-3
# The type each file type gives most matrices of a model whose rows split into 256s.
MAIN_FORMAT = {"Q5_0": "Q5_0", "IQ4_NL": "IQ4_NL", "Q3_K_M": "Q3_K", "Q2_K": "Q2_K", "IQ4_XS": "IQ4_XS"}


def golden(key: str, path: Path) -> dict:
    doc = json.loads((GOLDEN / "gguf_types_greedy.json").read_text(encoding="utf-8"))
    entry = doc["files"][key]
    if tensors_sha256(path) != entry["tensors_sha256"]:
        pytest.fail(f"{key}: the file nvllm's quantizers make is not the one the golden was made from "
                    "(quantizer or shipped file changed?): run tests/golden/make_golden_gguf.py")
    return entry


@pytest.fixture(scope="module")
def tiny256(tmp_path_factory) -> dict[str, Path]:
    return tiny256_files(tmp_path_factory.mktemp("tiny256"))


@pytest.fixture(scope="module")
def smollm2_typed(smollm2_gguf, tmp_path_factory) -> dict[str, Path]:
    return smollm2_files(smollm2_gguf, tmp_path_factory.mktemp("smollm2-types"))


def formats(model: Model) -> Counter:
    """The storage formats the layers and the output matrix hold ("F32" where one was widened)."""
    held = [w for layer in model.weights.layers for w in vars(layer).values()] + [model.weights.lm_head]
    return Counter(f for w in held if isinstance(w, Weight) for f in w.formats)


@pytest.fixture(scope="module", params=FILE_TYPES)
def tiny256_model(request, tiny256) -> tuple[str, Model]:
    g = read_gguf(tiny256[request.param])
    return request.param, Model(g.config, load_gguf_weights(g))


def test_tiny256_holds_its_type_in_place(tiny256_model):
    file_type, model = tiny256_model
    held = formats(model)
    assert MAIN_FORMAT[file_type] in held and "F32" not in held, held


@pytest.mark.usefixtures("exact_float_matmuls")
@pytest.mark.parametrize("schedule", ["whole", "token_by_token"])
def test_tiny256_logits_match_transformers(tiny256_model, tiny256, schedule, kernel_path):
    file_type, model = tiny256_model
    golden(f"tiny256-{file_type}", tiny256[file_type])
    ref = load_file(GOLDEN / "gguf_types_tiny256.safetensors")
    ids, want = ref[f"{file_type}_ids"], ref[f"{file_type}_logits"]
    steps = [[len(ids)]] if schedule == "whole" else [[1]] * len(ids)
    diff = np.abs(run_schedule(model, [ids], steps)[0] - want).max()
    assert diff < TOL, f"tiny256-{file_type} {schedule}: max |logit diff| {diff:.2e}"


def check_greedy(key: str, path: Path, least: int) -> None:
    cases = golden(key, path)["cases"]
    assert len(cases) >= least, f"{key}: only {len(cases)} clear greedy cases in the golden"
    llm = LLM(path, num_blocks=64, max_model_len=1024, kv_cache_dtype="f32", activations="exact")
    outs = llm.generate([{"prompt_token_ids": c["prompt_ids"]} for c in cases],
                        SamplingParams(temperature=0, max_tokens=max(len(c["output_ids"]) for c in cases)))
    for c, o in zip(cases, outs):
        n = len(c["output_ids"])
        assert o.token_ids[:n] == c["output_ids"], f"{key} / {c['name']}"
        if c["stopped_at_eos"]:
            assert o.finish_reason == "stop" and len(o.token_ids) == n, f"{key} / {c['name']}"


@pytest.mark.usefixtures("keep_int_variant")
@pytest.mark.parametrize("file_type", FILE_TYPES)
def test_tiny256_greedy_matches_transformers(file_type, tiny256):
    check_greedy(f"tiny256-{file_type}", tiny256[file_type], least=2)


@pytest.mark.slow
@pytest.mark.usefixtures("keep_int_variant")
@pytest.mark.parametrize("file_type", FILE_TYPES)
def test_smollm2_greedy_matches_transformers(file_type, smollm2_typed):
    """SmolLM2 written again in each type by nvllm's quantizers (llama-quantize's bytes): transformers'
    greedy tokens, on chat and raw prompts."""
    check_greedy(f"smollm2-{file_type}", smollm2_typed[file_type], least=6)
