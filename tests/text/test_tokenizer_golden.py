"""Our tokenizer against transformers' ids, recorded in tests/golden/tokenizer_<model>.json.

tests/golden/make_golden.py writes those files with transformers (in a separate venv); each refers to the
model folder models/<model> (tiny ones are also rebuilt byte-identically by models/make_test_models.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.paths import ROOT as REPO
from nvllm.text.tokenizer import Tokenizer

# A golden that carries its GGUF vocabulary ("metadata") is a SentencePiece file's, with no folder:
# tests/text/test_tokenizer_gguf_spm.py reads those; one that carries its folder's files ("folder"),
# tests/text/test_gguf_special_tokens_strip.py.
GOLDEN_FILES = sorted(p for p in (REPO / "tests" / "golden").glob("tokenizer_*.json")
                      if not {"metadata", "folder"} & json.loads(p.read_text(encoding="utf-8")).keys())
NO_GOLDEN = "no tests/golden/tokenizer_*.json yet (written by tests/golden/make_golden.py with transformers)"


def load_golden(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def model_name(path: Path) -> str:
    return load_golden(path).get("model") or path.stem[len("tokenizer_"):]


_cache: dict[str, Tokenizer] = {}


@pytest.fixture
def tokenizer_for(request):
    def get(name: str) -> Tokenizer:
        if name not in _cache:
            folder = REPO / "models" / name
            if name == "smollm2-135m-instruct":
                folder = request.getfixturevalue("smollm2")  # skips, or fails in CI, when not pulled
            elif not (folder / "tokenizer.json").is_file():
                tiny = request.getfixturevalue("tiny_models")
                if name not in tiny:
                    pytest.skip(f"models/{name} not present (pull it, or run models/make_test_models.py)")
                folder = tiny[name]
            _cache[name] = Tokenizer.from_dir(folder)
        return _cache[name]
    return get


# The tiny models' files also run on emulated aarch64 (deploy/aarch64-check.sh, pytest -m aarch64).
golden = pytest.mark.parametrize(
    "path", [pytest.param(p, marks=[] if "smollm2" in p.name else [pytest.mark.aarch64]) for p in GOLDEN_FILES]
    or [pytest.param(None, marks=pytest.mark.skip(reason=NO_GOLDEN))],
    ids=lambda p: p.stem if p else "none",
)


HINT = (
    "\n(nvllm runs tokenizer.json as it is. transformers 5's AutoTokenizer rebuilds some classes' pipelines "
    "(GPT2Tokenizer, Qwen2Tokenizer) and drops tokenizer.json's pre-tokenizer; goldens made that way differ on "
    "whitespace and digit runs. PreTrainedTokenizerFast.from_pretrained keeps the file's pipeline.)"
)


def mismatches(pairs: list[tuple]) -> str:
    lines = (f"  {what!r}:\n    transformers {want}\n    nvllm        {got}" for what, want, got in pairs)
    return "\n".join(lines) + HINT


@golden
def test_encode_matches_transformers(path, tokenizer_for):
    doc = load_golden(path)
    tok = tokenizer_for(model_name(path))
    bad = [(c["text"], c["ids"], tok.encode(c["text"])) for c in doc["encode"] if tok.encode(c["text"]) != c["ids"]]
    assert not bad, f"{len(bad)}/{len(doc['encode'])} encode cases differ:\n{mismatches(bad)}"


@golden
def test_decode_matches_transformers(path, tokenizer_for):
    doc = load_golden(path)
    tok = tokenizer_for(model_name(path))
    cases = [c for c in doc["encode"] if "decoded" in c]
    bad = [(c["ids"], c["decoded"], tok.decode(c["ids"])) for c in cases if tok.decode(c["ids"]) != c["decoded"]]
    assert not bad, f"{len(bad)}/{len(cases)} decode cases differ:\n{mismatches(bad)}"


@golden
def test_chat_matches_transformers(path, tokenizer_for):
    doc = load_golden(path)
    tok = tokenizer_for(model_name(path))
    bad = []
    for case in doc["chat"]:
        gen = case.get("add_generation_prompt", True)
        if "text" in case and tok.render_chat(case["messages"], gen) != case["text"]:
            bad.append((case["messages"], case["text"], tok.render_chat(case["messages"], gen)))
        if tok.encode_chat(case["messages"], gen) != case["ids"]:
            bad.append((case["messages"], case["ids"], tok.encode_chat(case["messages"], gen)))
    assert not bad, f"{len(bad)} chat cases differ:\n{mismatches(bad)}"
