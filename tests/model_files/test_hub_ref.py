"""Hub references as users write them (llama-server's -hf, Ollama's hf.co/...), and which GGUF of a repository
a quantization's name picks."""

from __future__ import annotations

import pytest

from nvllm.model_files.hub_ref import HubRef, is_split, parse_ref, pick_gguf, quant_of, quants_of


@pytest.mark.parametrize("text,want", [
    ("Qwen/Qwen2.5-1.5B-Instruct-GGUF", HubRef("Qwen/Qwen2.5-1.5B-Instruct-GGUF")),
    ("Qwen/Qwen2.5-1.5B-Instruct-GGUF:Q4_K_M", HubRef("Qwen/Qwen2.5-1.5B-Instruct-GGUF", quant="Q4_K_M")),
    ("hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:q8_0", HubRef("bartowski/Llama-3.2-1B-Instruct-GGUF", "q8_0")),
    ("huggingface.co/HuggingFaceTB/SmolLM2-360M-Instruct", HubRef("HuggingFaceTB/SmolLM2-360M-Instruct")),
    ("https://huggingface.co/HuggingFaceTB/SmolLM2-360M-Instruct", HubRef("HuggingFaceTB/SmolLM2-360M-Instruct")),
    ("hf.co/org/repo:latest", HubRef("org/repo")),          # what Ollama's clients add: the default
    ("org/repo/model-q4_k_m.gguf", HubRef("org/repo", file="model-q4_k_m.gguf")),
    ("org/repo/sub/dir/model.gguf", HubRef("org/repo", file="sub/dir/model.gguf")),
])
def test_each_spelling_names_a_repository_and_what_of_it(text: str, want: HubRef) -> None:
    got = parse_ref(text)
    assert got is not None
    assert (got.repo, got.quant, got.file) == (want.repo, want.quant, want.file)
    assert got.given == text


@pytest.mark.parametrize("text", [
    "smollm2-135m-instruct", "", "/abs/model.gguf", "./models/x", "../x/y", "~/x/y", "org/re--po", "org/..",
    "org/repo:Q4 K", "org/repo/README.md", "org/repo/x.gguf:Q4_0", "https://example.com/org/repo", "a b/c",
    "org/repo/../x.gguf",
])
def test_what_is_not_a_hub_reference_is_none(text: str) -> None:
    assert parse_ref(text) is None


def test_canonical_names() -> None:
    assert parse_ref("org/repo:Q4_K_M").canonical() == "hf.co/org/repo:Q4_K_M"        # type: ignore[union-attr]
    assert parse_ref("huggingface.co/org/repo").canonical() == "hf.co/org/repo"       # type: ignore[union-attr]
    assert parse_ref("org/repo/a.gguf").canonical() == "hf.co/org/repo/a.gguf"         # type: ignore[union-attr]


FILES = ["README.md", "Model-IQ4_XS.gguf", "Model-Q4_K_M.gguf", "Model-Q4_K_S.gguf", "Model-Q8_0.gguf",
         "Model.f16.gguf", "mmproj-Model-f16.gguf", "big/Model-Q6_K-00001-of-00002.gguf",
         "big/Model-Q6_K-00002-of-00002.gguf"]


def test_the_quantization_in_a_file_name() -> None:
    assert [quant_of(f) for f in FILES[1:6]] == ["IQ4_XS", "Q4_K_M", "Q4_K_S", "Q8_0", "F16"]
    assert quant_of("big/Model-Q6_K-00001-of-00002.gguf") == "Q6_K"
    assert quant_of("qwen2.5-1.5b-instruct-q4_k_m.gguf") == "Q4_K_M"
    assert quant_of("SmolLM2-135M-Instruct.Q4_1.gguf") == "Q4_1"
    assert quant_of("model.gguf") == ""
    assert quants_of(FILES) == ["IQ4_XS", "Q4_K_M", "Q4_K_S", "Q8_0", "F16", "Q6_K"]   # mmproj is no model


def test_a_quantization_picks_its_file_case_insensitively() -> None:
    assert pick_gguf(FILES, "q4_k_m") == ["Model-Q4_K_M.gguf"]
    assert pick_gguf(FILES, "Q4_K_S") == ["Model-Q4_K_S.gguf"]
    assert pick_gguf(FILES, "F16") == ["Model.f16.gguf"]
    assert pick_gguf(FILES, "Q4_K") == []               # a prefix of Q4_K_M is not Q4_K_M
    assert pick_gguf(FILES, "Q4_XS") == []              # nor IQ4_XS's tail
    assert pick_gguf(FILES, "Q5_K_M") == []


def test_the_default_is_q4_k_m_else_q4_0_else_the_first() -> None:
    assert pick_gguf(FILES, "") == ["Model-Q4_K_M.gguf"]
    assert pick_gguf(["a-Q8_0.gguf", "a-Q4_0.gguf"], "") == ["a-Q4_0.gguf"]
    assert pick_gguf(["b-Q8_0.gguf", "a-F16.gguf", "mmproj-x.gguf"], "") == ["a-F16.gguf"]
    assert pick_gguf(["config.json"], "") == []


def test_a_split_gguf_is_all_its_parts() -> None:
    assert pick_gguf(FILES, "Q6_K") == ["big/Model-Q6_K-00001-of-00002.gguf", "big/Model-Q6_K-00002-of-00002.gguf"]
    assert is_split("x-00001-of-00003.gguf") and not is_split("x-Q4_0.gguf")
