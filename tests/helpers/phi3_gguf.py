"""A tiny Phi-3-mini tokenizer in both forms: its Hugging Face folder and the GGUF llama.cpp's converter writes
for that folder (tests/text/test_gguf_special_tokens_strip.py).

tests/golden/tokenizer_spm-phi3.json (made by make_golden_spm_phi3.py) holds the folder's files and the pieces
of its tokenizer.model as SentencePiece gives them; the GGUF is written from those as convert_hf_to_gguf.py's
Phi3MiniModel does: the general.* keys from the folder (gguf.Metadata, so general.name comes from the folder's
name), the pieces with their scores and types, the folder's added tokens over them (user-defined, control
where special, score -1000), "[PADi]" unused tokens up to config.json's vocab_size, tokenizer.ggml.pre
"default", and gguf.SpecialVocab's ids, add_bos/add_eos flags and chat template. No hyperparameters, no
tensors: the tokenizer part alone.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import gguf

from helpers.paths import GOLDEN
from nvllm.model.weights.gguf_reader import read_header


@cache
def phi3_golden() -> dict[str, Any]:
    return json.loads((GOLDEN / "tokenizer_spm-phi3.json").read_text(encoding="utf-8"))


def write_phi3_folder(folder: Path) -> Path:
    """The golden's tokenizer files (no tokenizer.model: its pieces stay in the golden) in folder."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, obj in phi3_golden()["folder"].items():
        (folder / name).write_text(json.dumps(obj, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    return folder


def _vocab(folder: Path, pieces: list[list[Any]]) -> tuple[list[str], list[float], list[int]]:
    """Phi3MiniModel.set_vocab's arrays: tokenizer.model's pieces, then added_tokens.json's, then
    tokenizer_config.json's added_tokens_decoder and tokenizer.json's added_tokens over them."""
    T = gguf.TokenType
    n = json.loads((folder / "config.json").read_text(encoding="utf-8"))["vocab_size"]
    tokens = [f"[PAD{i}]" for i in range(n)]
    scores = [-10000.0] * n
    types = [int(T.UNUSED)] * n
    for i, (piece, score, kind) in enumerate(pieces):
        tokens[i], scores[i], types[i] = piece, score, kind
    for token, i in json.loads((folder / "added_tokens.json").read_text(encoding="utf-8")).items():
        if i < n:
            tokens[i], scores[i], types[i] = token, -1000.0, int(T.USER_DEFINED)
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    declared = [(int(i), t) for i, t in config.get("added_tokens_decoder", {}).items()]
    added = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8")).get("added_tokens", [])
    for i, t in declared + [(int(t["id"]), t) for t in added]:
        tokens[i], scores[i] = t["content"], -1000.0
        types[i] = int(T.CONTROL if t.get("special") else T.USER_DEFINED)
    return tokens, scores, types


def write_phi3_gguf(folder: Path, out: Path) -> Path:
    """The tokenizer part of the GGUF llama.cpp's converter writes for folder (no tensors)."""
    tokens, scores, types = _vocab(folder, phi3_golden()["sentencepiece"])
    w = gguf.GGUFWriter(str(out), "phi3")
    meta = gguf.Metadata.load(None, folder, None, 0)
    if meta.name is None:
        meta.name = folder.name
    meta.set_gguf_meta_model(w)
    w.add_type(gguf.GGUFType.MODEL)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    gguf.SpecialVocab(folder, n_vocab=len(tokens)).add_to_gguf(w, quiet=True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    return out


def gguf_metadata(path: Path) -> dict[str, Any]:
    """The file's key/values as nvllm's reader gives them to Tokenizer.from_gguf_metadata."""
    data = path.read_bytes()
    metadata, _, _ = read_header(memoryview(data), path)
    return metadata
