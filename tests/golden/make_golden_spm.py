"""Write the SentencePiece tokenizer goldens: tests/golden/tokenizer_spm-llama.json and tokenizer_spm-gemma.json.

Each holds a tiny SentencePiece BPE model (byte fallback on) trained here on a fixed built-in corpus, as
the GGUF tokenizer metadata llama.cpp's converter writes for it (convert_hf_to_gguf.py's
_set_vocab_sentencepiece and gguf.SpecialVocab, written with gguf.GGUFWriter and read back with
gguf.GGUFReader), and the ids the model's own tokenizer gives: transformers' sentencepiece-backed
tokenizer (SentencePieceBackend, legacy: the text between special tokens is encoded by SentencePiece
alone, each piece with its dummy prefix, as llama.cpp does) with BOS in front, and SentencePiece's decode.

  spm-llama   Llama 2 / TinyLlama / Mistral / Phi-3 conventions: <unk> <s> </s> at 0, 1, 2, the dummy prefix
              ("▁" in front), a Phi-3-style chat template of control tokens
  spm-gemma   Gemma's: <pad> <eos> <bos> <unk> at 0..3, no dummy prefix (add_space_prefix false),
              <start_of_turn> / <end_of_turn> control tokens and Gemma's template

How to run (from the repository root, in the reference venv with sentencepiece, transformers and gguf):

    .refvenv/bin/python tests/golden/make_golden_spm.py

Running twice gives byte-identical files (one training thread, no sampling).
"""

from __future__ import annotations

import io
import json
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

import gguf
import sentencepiece as spm
import transformers
from transformers.tokenization_utils_sentencepiece import SentencePieceBackend

OUT = Path(__file__).resolve().parent

_PARAGRAPHS = [
    "The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step.",
    "Hello, world! How are you today? I am fine, thank you, and you?",
    "In 1969 the first people walked on the moon; 3.14159 is close to pi, and 2 + 2 = 4.",
    "def add(a, b):\n    return a + b\n\nclass Point:\n    def __init__(self, x, y):\n        self.x = x\n",
    "for i in range(10):\n\tprint(i * 2)  # tabs and spaces\nif x == 0:\n    break\n",
    "Die Größe des Hauses ist schön. Il était une fois un café près de la forêt. ¿Dónde está la estación?",
    "The weather is nice today, so we went for a walk in the park and saw many birds and trees.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 42 365 2024 and dates like 2026-12-03 or 07/04/1776.",
    "User: what is the capital of France?\nAssistant: The capital of France is Paris.\n",
    "import numpy as np\nx = np.zeros((3, 4), dtype=np.float32)\nprint(x.shape, x.sum())\n",
    '{"name": "nvllm", "version": 1, "tags": ["edge", "serving"], "ok": true}',
    "Machine learning models turn text into tokens, and tokens into numbers that a network can read.",
]
CORPUS = [p for _ in range(8) for p in _PARAGRAPHS]

TEXTS = [
    "Hello, world!",
    "The answer is 42, not 4242 or 3.14159; 1,000,000 items at 99%",
    "def f(x):\n    return {'a': [1, 2]}\n\n\tprint(x)  # tab and spaces\n",
    "   \n\t  mixed   whitespace \t\n\n\n",
    "  two leading spaces",
    " one leading space",
    "trailing spaces   ",
    "Größe café naïve forêt",
    "東京 and 🚀 emoji 👍🏽 Здравствуйте",
    "decomposed: cafe\u0301",
    "",
    " ",
    "\n",
]


def random_texts(n: int = 24) -> list[str]:
    """Seeded strings of the corpus's characters and a few outside it: where pieces compete."""
    rng = random.Random(0)
    chars = sorted(set("".join(_PARAGRAPHS))) + list("東🚀\u0301")
    words = " ".join(_PARAGRAPHS).split(" ")
    out = ["".join(rng.choice(chars) for _ in range(rng.randint(1, 30))) for _ in range(n // 2)]
    return out + [" ".join(rng.choice(words) for _ in range(rng.randint(1, 8))) for _ in range(n // 2)]

LLAMA_TEMPLATE = ("{{ bos_token }}{% for message in messages %}{{ '<|' + message['role'] + '|>\n' + "
                  "message['content'] + '<|end|>\n' }}{% endfor %}{% if add_generation_prompt %}"
                  "{{ '<|assistant|>\n' }}{% endif %}")
GEMMA_TEMPLATE = ("{{ bos_token }}{% for message in messages %}{% set role = 'model' if message['role'] == "
                  "'assistant' else message['role'] %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim"
                  " + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}"
                  "{% endif %}")
MESSAGES = [
    [{"role": "user", "content": "What is 2 + 2?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Größe von 東京? 🚀"},
     {"role": "assistant", "content": "Very large."}, {"role": "user", "content": "def f(x):\n\treturn x\n"}],
]

VARIANTS: dict[str, dict[str, Any]] = {
    "spm-llama": {
        "ids": {"unk_id": 0, "bos_id": 1, "eos_id": 2, "pad_id": -1},
        "names": {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"},
        "control": ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"],
        "dummy_prefix": True,
        "template": LLAMA_TEMPLATE,
        "special_texts": ["<s>Hello</s>", "<|user|>\nHi there<|end|>\n<|assistant|>\n", "a<|end|>b <|end|> c",
                          "<s> spaced </s>"],
    },
    "spm-gemma": {
        "ids": {"pad_id": 0, "eos_id": 1, "bos_id": 2, "unk_id": 3},
        "names": {"pad_token": "<pad>", "eos_token": "<eos>", "bos_token": "<bos>", "unk_token": "<unk>"},
        "control": ["<start_of_turn>", "<end_of_turn>"],
        "dummy_prefix": False,
        "template": GEMMA_TEMPLATE,
        "special_texts": ["<bos>Hello<eos>", "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n",
                          "a<end_of_turn>b <end_of_turn> c"],
    },
}


def train(spec: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS), model_writer=buf, model_type="bpe", vocab_size=700, hard_vocab_limit=False,
        byte_fallback=True, character_coverage=1.0, split_digits=True, allow_whitespace_only_pieces=True,
        remove_extra_whitespaces=False, normalization_rule_name="identity", add_dummy_prefix=spec["dummy_prefix"],
        control_symbols=spec["control"], num_threads=1, minloglevel=2,
        unk_piece="<unk>", bos_piece=spec["names"]["bos_token"], eos_piece=spec["names"]["eos_token"],
        pad_piece=spec["names"].get("pad_token", "<pad>"), **spec["ids"])
    return buf.getvalue()


def write_folder(folder: Path, model: bytes, spec: dict[str, Any]) -> None:
    """What a Hugging Face folder of such a model holds for the converter: tokenizer.model, the config's ids
    and tokenizer_config.json's flags, special tokens and template."""
    (folder / "tokenizer.model").write_bytes(model)
    ids = {k.replace("_id", "_token_id"): v for k, v in spec["ids"].items() if v >= 0 and k != "unk_id"}
    (folder / "config.json").write_text(json.dumps(ids))
    config = dict(spec["names"], add_bos_token=True, add_eos_token=False, chat_template=spec["template"],
                  legacy=True)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


def gguf_metadata(folder: Path) -> dict[str, Any]:
    """The converter's _set_vocab_sentencepiece + SpecialVocab, written and read back."""
    sp = spm.SentencePieceProcessor(model_file=str(folder / "tokenizer.model"))
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        kind = gguf.TokenType.NORMAL
        if sp.is_unknown(i):
            kind = gguf.TokenType.UNKNOWN
        elif sp.is_control(i):
            kind = gguf.TokenType.CONTROL
        elif sp.is_unused(i):
            kind = gguf.TokenType.UNUSED
        elif sp.is_byte(i):
            kind = gguf.TokenType.BYTE
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        types.append(int(kind))
    from sentencepiece import sentencepiece_model_pb2 as pb
    proto = pb.ModelProto()
    proto.ParseFromString((folder / "tokenizer.model").read_bytes())
    path = folder / "vocab.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    if not proto.normalizer_spec.add_dummy_prefix:  # Gemma's converter says so; Llama's leaves the default
        w.add_add_space_prefix(False)
    gguf.SpecialVocab(folder, n_vocab=len(tokens)).add_to_gguf(w, quiet=True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    reader = gguf.GGUFReader(str(path))
    out = {}
    for name, field in reader.fields.items():
        if name.startswith("tokenizer."):
            value = field.contents()
            out[name] = [float(v) for v in value] if name == "tokenizer.ggml.scores" else value
    return out


def reference(folder: Path, spec: dict[str, Any]) -> tuple[SentencePieceBackend, spm.SentencePieceProcessor]:
    names = spec["names"]
    tok = SentencePieceBackend(vocab_file=str(folder / "tokenizer.model"), legacy=True,
                               additional_special_tokens=spec["control"], **names)
    tok.chat_template = spec["template"]
    return tok, spm.SentencePieceProcessor(model_file=str(folder / "tokenizer.model"))


def encode(tok: SentencePieceBackend, sp: spm.SentencePieceProcessor, text: str, add_bos: bool) -> list[int]:
    ids = tok(text, add_special_tokens=False)["input_ids"]
    # the same by hand: each stretch between special tokens through SentencePiece alone
    specials = sorted({str(t) for t in tok.all_special_tokens}, key=len, reverse=True)
    by_hand, rest = [], text
    while rest:
        at = min(((rest.find(s), -len(s), s) for s in specials if s in rest), default=None)
        head = rest if at is None else rest[:at[0]]
        if head:
            by_hand += sp.encode(head)
        if at is None:
            break
        by_hand.append(sp.piece_to_id(at[2]))
        rest = rest[at[0] + len(at[2]):]
    if ids != by_hand:
        sys.exit(f"transformers and SentencePiece disagree on {text!r}: {ids} vs {by_hand}")
    return ([tok.bos_token_id] if add_bos else []) + ids


def cases(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write_folder(folder, train(spec), spec)
        metadata = gguf_metadata(folder)
        tok, sp = reference(folder, spec)
        control = {sp.piece_to_id(t) for t in spec["control"]} | {tok.bos_token_id, tok.eos_token_id}
        doc: dict[str, Any] = {"model": name, "metadata": metadata, "encode": [], "chat": []}
        for text in TEXTS + _PARAGRAPHS + random_texts() + spec["special_texts"]:
            ids = encode(tok, sp, text, add_bos=True)
            kept = [i for i in ids if i not in control]
            doc["encode"].append({"text": text, "ids": ids, "pieces": [sp.id_to_piece(i) for i in ids],
                                  "decoded": sp.decode(kept)})
        for messages in MESSAGES:
            text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            doc["chat"].append({"messages": messages, "add_generation_prompt": True, "text": text,
                                "ids": encode(tok, sp, text, add_bos=False)})
        doc["versions"] = {"sentencepiece": spm.__version__, "transformers": transformers.__version__,
                           "gguf": "0.19.0"}
        return doc


def main() -> None:
    for name, spec in VARIANTS.items():
        doc = cases(name, spec)
        path = OUT / f"tokenizer_{name}.json"
        path.write_text(json.dumps(doc, ensure_ascii=False, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        print(f"{path.name}: {len(doc['metadata']['tokenizer.ggml.tokens'])} tokens, {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
