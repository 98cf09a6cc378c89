"""What the tokenizer tests share (tests/text/test_tokenizer.py, test_chat_template.py, test_detokenizer.py,
test_tokenizer_smollm2.py): a Llama-2-style SentencePiece tokenizer built in memory, the streaming check of the
incremental detokenizer, the hypothesis settings of the property tests, and the chat messages they render."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from hypothesis import HealthCheck, settings

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tokenizers import Tokenizer as Backend  # noqa: E402
from tokenizers import models as tk_models  # noqa: E402
from tokenizers import normalizers, trainers  # noqa: E402

from nvllm.text.detokenizer import IncrementalDetokenizer  # noqa: E402
from nvllm.text.tokenizer import Tokenizer  # noqa: E402

# NVLLM_HYPOTHESIS_EXAMPLES=5000 for a deeper search than the default run.
PROPERTY = settings(
    max_examples=int(os.environ.get("NVLLM_HYPOTHESIS_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)

SYSTEM = {"role": "system", "content": "Be brief."}
USER = {"role": "user", "content": "Hi!"}

SP_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello, world! How are you today?",
    "def add(a, b):\n    return a + b\n",
    "Die Größe des Hauses ist schön.",
    "The answer is 42.",
]


def build_sentencepiece_style() -> Tokenizer:
    """A Llama-2-style tokenizer: Metaspace normalizer, BPE with byte fallback, a decoder that strips the
    leading space, BOS added by the post-processor. The tiny test models are byte-level; this covers the
    other family of decoders."""
    trainer = trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    base = Backend(tk_models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    base.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    base.train_from_iterator(SP_CORPUS * 3, trainer)
    spec = json.loads(base.to_str())
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):  # byte tokens sit in the model vocabulary, as in Llama 2
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece, _ in sorted(spec["model"]["vocab"].items(), key=lambda kv: kv[1]):
        vocab.setdefault(piece, len(vocab))
    spec["model"]["vocab"] = vocab
    spec["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
        {"type": "ByteFallback"},
        {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0},
    ]}
    bos = {"SpecialToken": {"id": "<s>", "type_id": 0}}
    spec["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}},
    }
    return Tokenizer(Backend.from_str(json.dumps(spec)),
                     special_tokens={"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"})



def stream(tok: Tokenizer, prompt: Sequence[int], output: Sequence[int], skip: bool = True) -> tuple[list[str], str]:
    """Every add() result, and the flush() at the end."""
    detok = IncrementalDetokenizer(tok, prompt, skip_special_tokens=skip)
    deltas = [detok.add(t) for t in output]
    tail = detok.flush()
    assert detok.text == "".join(deltas) + tail
    return deltas, tail
