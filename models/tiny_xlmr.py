"""The tiny XLM-RoBERTa cross-encoder for make_test_models.py (beside this file, which lists it with the others):
bge-reranker's family at tiny-bert's size, with a SentencePiece Unigram tokenizer (tiny_unigram.py) in both the
forms a real XLM-R folder carries: tokenizer.json and sentencepiece.bpe.model.

  tiny-xlmr-reranker  XLMRobertaForSequenceClassification, one label: RoBERTa's head (dense, tanh, out_proj)
                      on the <s> state; pad_token_id 1, so positions count from 2 (130 rows for 128 tokens);
                      one token type; LayerNorm eps 1e-5 (bge-reranker-v2-m3's)

The ids are XLM-R's: <s> 0, <pad> 1, </s> 2, <unk> 3, SentencePiece's piece i at i + 1, <mask> last. tokenizer.json
is the pipeline transformers 5 builds for XLMRobertaTokenizer from the vocabulary (it rebuilds it whatever the
file says, so the file must be that pipeline to tokenize the same): the Precompiled normalizer, whitespace split
then Metaspace (a "▁" before every word), <s> A </s> and <s> A </s></s> B </s> (token types all 0).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

import tiny_kit as kit
from tiny_encoders import Draw, bert_config, bert_tensors
from tiny_unigram import SPACE, precompiled_charsmap, sentencepiece_model, unigram_pieces

SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")   # ids 0..3; <mask> is the last id
BOS_ID, PAD_ID, EOS_ID, UNK_ID = range(4)
MAX_LEN = 128


def unigram_tokenizer() -> Tokenizer:
    """XLM-R's tokenizer over the tiny Unigram vocabulary, as transformers' XLMRobertaTokenizer builds it."""
    vocab = [(t, 0.0) for t in SPECIALS] + list(unigram_pieces()) + [("<mask>", 0.0)]
    tok = Tokenizer(models.Unigram(vocab, unk_id=UNK_ID, byte_fallback=False))
    tok.normalizer = normalizers.Precompiled(precompiled_charsmap())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="always")])
    tok.decoder = decoders.Metaspace(replacement=SPACE, prepend_scheme="always")
    tok.add_special_tokens([*SPECIALS, AddedToken("<mask>", lstrip=True, special=True)])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", BOS_ID), ("</s>", EOS_ID)])
    return tok


def write_unigram(out: Path, tok: Tokenizer) -> None:
    """tokenizer.json, sentencepiece.bpe.model and transformers' XLMRobertaTokenizer files."""
    tok.save(str(out / "tokenizer.json"))
    (out / "sentencepiece.bpe.model").write_bytes(sentencepiece_model(unigram_pieces(), precompiled_charsmap()))
    mask = tok.get_vocab_size() - 1
    special = {"bos_token": "<s>", "cls_token": "<s>", "eos_token": "</s>", "mask_token": "<mask>",
               "pad_token": "<pad>", "sep_token": "</s>", "unk_token": "<unk>"}
    added = {str(i): {"content": t, "lstrip": t == "<mask>", "normalized": False, "rstrip": False,
                      "single_word": False, "special": True}
             for i, t in [*enumerate(SPECIALS), (mask, "<mask>")]}
    kit.write_json(out / "tokenizer_config.json", {
        "added_tokens_decoder": added, **special, "clean_up_tokenization_spaces": True,
        "model_max_length": MAX_LEN, "sp_model_kwargs": {}, "tokenizer_class": "XLMRobertaTokenizer"})
    kit.write_json(out / "special_tokens_map.json", special)


def xlmr_config(vocab: int) -> dict[str, Any]:
    cfg = bert_config(vocab, "XLMRobertaForSequenceClassification")
    cfg.update(model_type="xlm-roberta", bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID,
               max_position_embeddings=MAX_LEN + PAD_ID + 1, type_vocab_size=1, layer_norm_eps=1e-5,
               id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0})
    return dict(sorted(cfg.items()))


def make_tiny_xlmr_reranker(out: Path, _tok: Any = None) -> None:
    """The score is out_proj(tanh(dense(h[<s>]))), one raw logit per pair. The padding rows of the word and
    position tables are zero, as nn.Embedding's padding_idx leaves them."""
    tok = unigram_tokenizer()
    write_unigram(out, tok)
    cfg = xlmr_config(tok.get_vocab_size())
    kit.write_json(out / "config.json", cfg)
    draw = Draw(34)
    t = bert_tensors(cfg, draw, prefix="roberta.")
    del t["roberta.pooler.dense.weight"], t["roberta.pooler.dense.bias"]   # XLM-R's classifier has no pooler
    for name in ("word_embeddings", "position_embeddings"):
        t[f"roberta.embeddings.{name}.weight"][PAD_ID] = 0.0
    h = cfg["hidden_size"]
    t["classifier.dense.weight"] = draw.normal(h, h, std=0.2)
    t["classifier.dense.bias"] = draw.normal(h, std=0.1)
    t["classifier.out_proj.weight"] = draw.normal(1, h, std=0.3)
    t["classifier.out_proj.bias"] = draw.normal(1, std=0.1)
    assert all(a.dtype == np.float32 for a in t.values())
    kit.save_tensors(dict(sorted(t.items())), out / "model.safetensors", "float32")


XLMR_BUILDERS = {"tiny-xlmr-reranker": make_tiny_xlmr_reranker}
