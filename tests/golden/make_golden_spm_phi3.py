"""Write tests/golden/tokenizer_spm-phi3.json: a tiny Phi-3-mini-like tokenizer, its folder and transformers' ids.

Phi-3-mini's tokenizer is Llama 2's SentencePiece model (tokenizer.model: <unk> <s> </s>, byte fallback) with
eleven tokens added after it (<|endoftext|>, <|assistant|>, <|placeholder1..4|>, <|system|>, <|end|>,
<|placeholder5|>, <|placeholder6|>, <|user|>), every one but <|endoftext|> flagged rstrip (it swallows the
whitespace after it), as is </s>, which is not special; config.json's vocab_size pads the embedding past them.
This script trains a small SentencePiece BPE model (make_golden_spm.py's corpus and settings, no control
symbols of its own) and lays the Hugging Face files out as Phi-3-mini-4k-instruct has them: tokenizer.json
(the legacy Llama pipeline: "▁" prepended to each stretch between added tokens), tokenizer_config.json (its
flags, added_tokens_decoder, special tokens and chat template), special_tokens_map.json, added_tokens.json and
the tokenizer part of config.json.

The golden holds those files ("folder"), the SentencePiece pieces as llama.cpp's converter reads them from
tokenizer.model ("sentencepiece": piece, score, token type), and the ids of a few texts ("encode") and chats
("chat"), each given alike by transformers' AutoTokenizer, by tokenizer.json run as it is, and by SentencePiece
by hand (the text cut at the added tokens, the whitespace after an rstrip one dropped, each stretch encoded
alone, as llama.cpp does); the script stops if they differ.

How to run (from the repository root, in the reference venv with sentencepiece, transformers and gguf):

    .refvenv/bin/python tests/golden/make_golden_spm_phi3.py

Running twice gives byte-identical files (one training thread, no sampling).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import sentencepiece as spm
import tokenizers
import transformers
from make_golden_spm import _PARAGRAPHS, TEXTS, train
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors
from transformers import AutoTokenizer
from transformers.tokenization_utils_sentencepiece import SentencePieceExtractor

OUT = Path(__file__).resolve().parent / "tokenizer_spm-phi3.json"

# Phi-3-mini-4k-instruct's added tokens, in id order after the SentencePiece pieces, and their rstrip flags.
ADDED = ["<|endoftext|>", "<|assistant|>", "<|placeholder1|>", "<|placeholder2|>", "<|placeholder3|>",
         "<|placeholder4|>", "<|system|>", "<|end|>", "<|placeholder5|>", "<|placeholder6|>", "<|user|>"]
NOT_RSTRIP = {"<unk>", "<s>", "<|endoftext|>"}
NOT_SPECIAL = {"</s>"}
PADDED = 16   # config.json's vocab_size: the pieces, the added tokens, and this many more (Phi-3: 32064)

TEMPLATE = ("{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + message['content']"
            " + '<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}"
            "{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}"
            "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}"
            "{% endif %}")

MESSAGES = [
    [{"role": "user", "content": "Name three planets in our solar system."}],
    [{"role": "system", "content": "You are a helpful assistant. Be brief."},
     {"role": "user", "content": "What is 2 + 2?"}],
    [{"role": "user", "content": "Hello!"}, {"role": "assistant", "content": "Hi, how can I help?"},
     {"role": "user", "content": "  Größe von 東京? 🚀\n\tdef f(x):\n"}],
    [{"role": "system", "content": "\n Be brief. \n"}, {"role": "user", "content": " \n"},
     {"role": "assistant", "content": "\n\nOK</s> \n"}, {"role": "user", "content": "x<|end|> \t\ny"}],
]
SPECIAL_TEXTS = [
    "<|user|>\nHi there<|end|>\n<|assistant|>\n",
    "<|user|>  \n\t Hi<|end|> \n\n<|assistant|>",
    "<s> a</s> b<unk> c<|endoftext|> d<|system|> e",
    "a </s>\n\nb <|end|>\n\nc",
    "<|placeholder1|> x<|placeholder6|>\ny",
]

SPEC = {"ids": {"unk_id": 0, "bos_id": 1, "eos_id": 2, "pad_id": -1},
        "names": {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"},
        "control": [], "dummy_prefix": True}


def added_token(content: str) -> AddedToken:
    return AddedToken(content, single_word=False, lstrip=False, rstrip=content not in NOT_RSTRIP,
                      normalized=False, special=content not in NOT_SPECIAL)


def token_entry(content: str) -> dict[str, Any]:
    t = added_token(content)
    return {"content": content, "lstrip": t.lstrip, "normalized": t.normalized, "rstrip": t.rstrip,
            "single_word": t.single_word, "special": t.special}


def tokenizer_json(model_file: Path) -> dict[str, Any]:
    """tokenizer.json as Phi-3-mini's: Llama's legacy fast pipeline over the SentencePiece model, the added
    tokens flagged as Phi-3's."""
    vocab, _, merges = SentencePieceExtractor(str(model_file)).extract()
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True,
                               dropout=None))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(content=" ", left=1, right=0)])
    # no BOS, as tokenizer_config.json's add_bos_token says (transformers 4 wrote it so on save)
    tok.post_processor = processors.TemplateProcessing(single="$A:0", pair="$A:0 $B:1", special_tokens=[])
    for content in ["<unk>", "<s>", "</s>", *ADDED]:
        tok.add_tokens([added_token(content)])
    doc = json.loads(tok.to_str())
    ids = [a["id"] for a in doc["added_tokens"]]
    if ids != [0, 1, 2, *range(len(vocab), len(vocab) + len(ADDED))]:
        sys.exit(f"added tokens at {ids}, not after the {len(vocab)} pieces")
    return doc


def write_folder(folder: Path, model: bytes) -> dict[str, Any]:
    (folder / "tokenizer.model").write_bytes(model)
    tj = tokenizer_json(folder / "tokenizer.model")
    n_pieces = len(tj["model"]["vocab"])
    ids = {a["content"]: a["id"] for a in tj["added_tokens"]}
    files: dict[str, Any] = {
        "tokenizer.json": tj,
        "tokenizer_config.json": {
            "add_bos_token": False, "add_eos_token": False,
            "added_tokens_decoder": {str(i): token_entry(t) for t, i in ids.items()},
            "bos_token": "<s>", "chat_template": TEMPLATE, "clean_up_tokenization_spaces": False,
            "eos_token": "<|endoftext|>", "legacy": False, "model_max_length": 4096, "pad_token": "<|endoftext|>",
            "padding_side": "left", "sp_model_kwargs": {}, "tokenizer_class": "LlamaTokenizer",
            "unk_token": "<unk>", "use_default_system_prompt": False},
        "special_tokens_map.json": {k: token_entry(v) for k, v in (("bos_token", "<s>"), ("eos_token", "<|endoftext|>"),
                                                                  ("pad_token", "<|endoftext|>"),
                                                                  ("unk_token", "<unk>"))},
        "added_tokens.json": {t: ids[t] for t in sorted(ADDED)},
        "config.json": {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "bos_token_id": 1,
                        "eos_token_id": ids["<|endoftext|>"], "pad_token_id": ids["<|endoftext|>"],
                        "vocab_size": n_pieces + len(ADDED) + PADDED},
    }
    for name, obj in files.items():
        (folder / name).write_text(json.dumps(obj, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    return files


def pieces(sp: spm.SentencePieceProcessor) -> list[list[Any]]:
    """What the converter reads from tokenizer.model: each piece, its score and its token type (gguf.TokenType:
    1 normal, 2 unknown, 3 control, 5 unused, 6 byte)."""
    out = []
    for i in range(sp.get_piece_size()):
        kind = 1
        if sp.is_unknown(i):
            kind = 2
        elif sp.is_control(i):
            kind = 3
        elif sp.is_unused(i):
            kind = 5
        elif sp.is_byte(i):
            kind = 6
        out.append([sp.id_to_piece(i), sp.get_score(i), kind])
    return out


def by_hand(sp: spm.SentencePieceProcessor, ids: dict[str, int], text: str) -> list[int]:
    """llama.cpp's way: cut at the added tokens (longest first), drop the whitespace after an rstrip one, and
    encode each stretch alone (each with SentencePiece's dummy prefix)."""
    out, rest = [], text
    while rest:
        at = min(((rest.find(t), -len(t), t) for t in ids if t in rest), default=None)
        head = rest if at is None else rest[:at[0]]
        if head:
            out += sp.encode(head)
        if at is None:
            break
        token = at[2]
        out.append(ids[token])
        rest = rest[at[0] + len(token):]
        if token not in NOT_RSTRIP:
            rest = rest.lstrip(" \t\n\v\f\r")
    return out


def cases(folder: Path) -> dict[str, Any]:
    sp = spm.SentencePieceProcessor(model_file=str(folder / "tokenizer.model"))
    raw = Tokenizer.from_file(str(folder / "tokenizer.json"))
    hf = AutoTokenizer.from_pretrained(folder)
    ids = {a.content: i for i, a in raw.get_added_tokens_decoder().items()}

    def agreed(text: str, want: list[int]) -> list[int]:
        got = {"tokenizer.json": raw.encode(text, add_special_tokens=False).ids, "by hand": by_hand(sp, ids, text)}
        for how, other in got.items():
            if other != want:
                sys.exit(f"transformers and {how} disagree on {text!r}:\n  {want}\n  {other}")
        return want

    doc: dict[str, Any] = {"encode": [], "chat": []}
    for text in TEXTS + _PARAGRAPHS[:4] + SPECIAL_TEXTS:
        want = hf(text)["input_ids"]   # add_bos_token is false: no BOS, as in the GGUF
        doc["encode"].append({"text": text, "ids": agreed(text, want)})
    for messages in MESSAGES:
        text = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        want = list(hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                           return_dict=True)["input_ids"])
        doc["chat"].append({"messages": messages, "add_generation_prompt": True, "text": text,
                            "ids": agreed(text, want)})
    doc["sentencepiece"] = pieces(sp)
    return doc


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        files = write_folder(folder, train(SPEC))
        doc = {"model": "spm-phi3", "folder": files, **cases(folder),
               "versions": {"sentencepiece": spm.__version__, "transformers": transformers.__version__,
                            "tokenizers": tokenizers.__version__}}
    OUT.write_text(json.dumps(doc, ensure_ascii=False, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"{OUT.name}: {len(doc['sentencepiece'])} pieces, {OUT.stat().st_size} bytes")


if __name__ == "__main__":
    main()
