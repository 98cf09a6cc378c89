"""The tiny BERT-family folders for make_test_models.py (beside this file, which lists them with the others):
embedding and reranking models, each with the one WordPiece tokenizer learnt here; tiny_kit.py lends the
writers. float32, seeded, byte-identical on every run (the WordPiece vocabulary is learnt in plain Python,
see wordpiece_vocab).

  tiny-bert           BertModel as a sentence-transformers folder: mean pooling, then Normalize
  tiny-bert-cls       BertModel (another seed): CLS pooling, a 2_Dense module (32 -> 16, tanh), then Normalize
  tiny-bert-reranker  BertForSequenceClassification, one label (a cross-encoder): pooler, then classifier

The shapes are BERT's at a toy size (hidden 32, 2 layers, 4 heads, intermediate 64, 128 positions, 2 token
types); the weights are scaled so that attention is not uniform and every LayerNorm, bias and token type
moves the output.
"""
from __future__ import annotations

import collections
import functools
import json
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

import tiny_kit as kit

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]   # ids 0..4
PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = range(5)
WORDPIECE_VOCAB = 1024   # a cap: the merges end sooner (896), when every word of CORPUS is one piece
MAX_LEN = 128

# Plain English the WordPiece vocabulary is learnt from: common words whole, rarer ones in pieces.
CORPUS = [
    "The quick brown fox jumps over the lazy dog, and the dog sleeps in the warm afternoon sun.",
    "A small library stands at the corner of the market square, open from 9 to 17 every day but Sunday.",
    "Search engines rank documents by how well they answer a query; the best answer comes first.",
    "An embedding model turns a sentence into a vector, so that similar sentences lie close together.",
    "The river flows north through the valley, past old mills, green fields and a quiet stone bridge.",
    "She asked the librarian where to find books about birds, trees, mountains and the weather.",
    "Our team measured the temperature at 6 stations: 12.5, 14.0, 9.75, 11.2, 13.8 and 10.1 degrees.",
    "Cooking rice is simple: rinse it, add water, bring it to a boil, then cover it and let it rest.",
    "The train to the city leaves at 8:45 in the morning and returns at 6:30 in the evening.",
    "Children played football in the park while their parents talked on the benches under the trees.",
    "Photosynthesis lets plants turn light, water and carbon dioxide into sugar and oxygen.",
    "The museum shows paintings, maps, coins and letters from the history of the town since 1820.",
    "Please send the report by Friday; include the budget, the schedule and a short summary.",
    "How do I reset my password? Open the settings page, choose security, and follow the steps.",
    "The capital of France is Paris, the capital of Germany is Berlin, and the capital of Italy is Rome.",
    "Honey bees visit thousands of flowers each day and carry pollen back to their hive.",
    "A good night's sleep improves memory, mood and attention, according to several studies.",
    "The ship sailed across the ocean for 40 days before the sailors saw land again.",
    "Mathematics describes patterns: numbers, shapes, change and chance all follow simple rules.",
    "Fresh bread, cheese, apples and tea were served for breakfast in the little hotel by the lake.",
    "The engineer checked the bridge, the cables and the road, and wrote down every crack she found.",
    "Rain is expected tomorrow, with strong winds in the west and snow on the highest mountains.",
    "Learning a language takes time: read every day, listen often, speak whenever you can.",
    "The computer stores data in memory and on disk, and the network moves it between machines.",
    "Doctors recommend walking, swimming or cycling for at least thirty minutes a day.",
    "In the story, a young girl finds a key, opens an old door, and discovers a secret garden.",
    "Markets opened higher on Monday as prices for oil, gold and wheat rose by 2 or 3 percent.",
    "Which planet is closest to the sun? Mercury is, and Venus is the hottest of them all.",
    "The recipe needs two eggs, one cup of flour, half a cup of milk and a pinch of salt.",
    "Volunteers cleaned the beach on Saturday and collected 250 kilograms of plastic and glass.",
]


# ---------------------------------------------------------------- tokenizer

def wordpiece_vocab(size: int = WORDPIECE_VOCAB) -> list[str]:
    """WordPiece's vocabulary learnt as tokenizers' WordPieceTrainer learns it (BPE merges over the corpus's
    words, "##" on the pieces inside a word), but here in Python with ties broken by the pieces' text: the
    trainer breaks them by ids it hands out in hash-map order, which changes from run to run.

    Start: the specials, then every printable ASCII character (lowercase: the normalizer lowercases) alone
    and as a "##" piece, so that only words with other characters (an emoji, say) become [UNK]."""
    norm, pre = _normalizer(), pre_tokenizers.BertPreTokenizer()
    counts: collections.Counter[str] = collections.Counter()
    for line in CORPUS:
        counts.update(w for w, _ in pre.pre_tokenize_str(norm.normalize_str(line)))
    chars = [chr(c) for c in range(33, 127) if not chr(c).isupper()]
    vocab = SPECIALS + chars + ["##" + c for c in chars if c.isalnum()]
    known = set(vocab)
    words = {w: [w[0]] + ["##" + c for c in w[1:]] for w in sorted(counts)}
    while len(vocab) < size:
        pairs: collections.Counter[tuple[str, str]] = collections.Counter()
        for w, pieces in words.items():
            for a, b in zip(pieces, pieces[1:]):
                pairs[a, b] += counts[w]
        if not pairs:
            break
        (a, b), _ = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))   # the most frequent; then by text
        merged = a + b[2:]
        for pieces in words.values():
            i = 0
            while i < len(pieces) - 1:
                if pieces[i] == a and pieces[i + 1] == b:
                    pieces[i:i + 2] = [merged]
                i += 1
        if merged not in known:
            known.add(merged)
            vocab.append(merged)
    return vocab


def _normalizer() -> normalizers.BertNormalizer:
    return normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None,
                                      lowercase=True)


@functools.cache
def train_wordpiece() -> Tokenizer:
    """An uncased BERT WordPiece tokenizer, the pipeline transformers' BertTokenizer builds from vocab.txt;
    made once per process."""
    vocab = wordpiece_vocab()
    tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]",
                                     continuing_subword_prefix="##", max_input_chars_per_word=100))
    tok.normalizer = _normalizer()
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.add_special_tokens(SPECIALS)
    for i, t in enumerate(SPECIALS):
        assert tok.token_to_id(t) == i, (t, tok.token_to_id(t))
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0",
        pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", CLS_ID), ("[SEP]", SEP_ID)],
    )
    return tok


def write_wordpiece(out: Path, tok: Tokenizer) -> None:
    """tokenizer.json, vocab.txt and transformers' BertTokenizer files (uncased, 128 tokens)."""
    tok.save(str(out / "tokenizer.json"))
    vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    assert [i for _, i in vocab] == list(range(len(vocab)))
    (out / "vocab.txt").write_text("".join(t + "\n" for t, _ in vocab), encoding="utf-8")
    special = {"cls_token": "[CLS]", "mask_token": "[MASK]", "pad_token": "[PAD]", "sep_token": "[SEP]",
               "unk_token": "[UNK]"}
    added = {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False, "special": True} for i, t in enumerate(SPECIALS)}
    kit.write_json(out / "tokenizer_config.json", {
        "added_tokens_decoder": added,
        "clean_up_tokenization_spaces": True,
        **special,
        "do_basic_tokenize": True,
        "do_lower_case": True,
        "model_max_length": MAX_LEN,
        "never_split": None,
        "strip_accents": None,
        "tokenize_chinese_chars": True,
        "tokenizer_class": "BertTokenizer",
    })
    kit.write_json(out / "special_tokens_map.json", special)


# ---------------------------------------------------------------- config and weights

def bert_config(vocab: int, architecture: str) -> dict[str, Any]:
    return {
        "architectures": [architecture],
        "model_type": "bert",
        "attention_probs_dropout_prob": 0.1,
        "classifier_dropout": None,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "hidden_size": 32,
        "initializer_range": 0.02,
        "intermediate_size": 64,
        "layer_norm_eps": 1e-12,
        "max_position_embeddings": MAX_LEN,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "pad_token_id": PAD_ID,
        "position_embedding_type": "absolute",
        "torch_dtype": "float32",
        "type_vocab_size": 2,
        "use_cache": True,
        "vocab_size": vocab,
    }


class Draw:
    """Seeded float32 draws: normal(...) for matrices, norm(n) for LayerNorm weights (1 with a spread)."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def normal(self, *shape: int, std: float) -> np.ndarray:
        return (self.rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)

    def norm(self, n: int) -> np.ndarray:
        return (1.0 + 0.15 * self.rng.standard_normal(n, dtype=np.float32)).astype(np.float32)


def bert_tensors(cfg: dict[str, Any], draw: Draw, prefix: str = "") -> dict[str, np.ndarray]:
    """BertModel's tensors in transformers' names ([out, in]), the pooler included; prefix "bert." for the
    task classes."""
    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    e = prefix + "embeddings."
    t = {e + "word_embeddings.weight": draw.normal(cfg["vocab_size"], h, std=1.0),
         e + "position_embeddings.weight": draw.normal(cfg["max_position_embeddings"], h, std=0.3),
         e + "token_type_embeddings.weight": draw.normal(cfg["type_vocab_size"], h, std=0.5),
         e + "LayerNorm.weight": draw.norm(h), e + "LayerNorm.bias": draw.normal(h, std=0.1)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"{prefix}encoder.layer.{i}."
        for name in ("query", "key", "value"):   # q, k at 0.35: scores of spread ~2, attention far from flat
            t[p + f"attention.self.{name}.weight"] = draw.normal(h, h, std=0.35 if name != "value" else 0.2)
            t[p + f"attention.self.{name}.bias"] = draw.normal(h, std=0.1)
        t.update({
            p + "attention.output.dense.weight": draw.normal(h, h, std=0.2),
            p + "attention.output.dense.bias": draw.normal(h, std=0.1),
            p + "attention.output.LayerNorm.weight": draw.norm(h),
            p + "attention.output.LayerNorm.bias": draw.normal(h, std=0.1),
            p + "intermediate.dense.weight": draw.normal(inter, h, std=0.2),
            p + "intermediate.dense.bias": draw.normal(inter, std=0.1),
            p + "output.dense.weight": draw.normal(h, inter, std=0.15),
            p + "output.dense.bias": draw.normal(h, std=0.1),
            p + "output.LayerNorm.weight": draw.norm(h),
            p + "output.LayerNorm.bias": draw.normal(h, std=0.1),
        })
    t[prefix + "pooler.dense.weight"] = draw.normal(h, h, std=0.2)
    t[prefix + "pooler.dense.bias"] = draw.normal(h, std=0.1)
    return t


# ---------------------------------------------------------------- sentence-transformers files

ST_TRANSFORMER = "sentence_transformers.models.Transformer"
ST_POOLING = "sentence_transformers.models.Pooling"
ST_DENSE = "sentence_transformers.models.Dense"
ST_NORMALIZE = "sentence_transformers.models.Normalize"


def pooling_config(dim: int, mode: str) -> dict[str, Any]:
    """1_Pooling/config.json as sentence-transformers 2-5 write it: one flag per mode."""
    modes = ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens", "weightedmean_tokens", "lasttoken")
    assert mode in modes, mode
    return {"word_embedding_dimension": dim, **{f"pooling_mode_{m}": m == mode for m in modes},
            "include_prompt": True}


def write_sentence_transformers(out: Path, modules: list[tuple[str, str]]) -> None:
    """modules.json for (path, type) after the Transformer at "", and the folder-level files in the form
    sentence-transformers 3-5 write them (its "__version__" block is that form's, not a record of a run)."""
    entries = [{"idx": 0, "name": "0", "path": "", "type": ST_TRANSFORMER}]
    entries += [{"idx": i, "name": str(i), "path": path, "type": kind}
                for i, (path, kind) in enumerate(modules, start=1)]
    out.joinpath("modules.json").write_text(json.dumps(entries, indent=2) + "\n", encoding="utf-8")
    for path, _ in modules:
        (out / path).mkdir()
    kit.write_json(out / "config_sentence_transformers.json", {
        "model_type": "SentenceTransformer",
        "__version__": {"sentence_transformers": "5.1.0", "transformers": "4.56.1", "pytorch": "2.8.0"},
        "prompts": {"query": "", "document": ""},
        "default_prompt_name": None,
        "similarity_fn_name": "cosine",
    })
    kit.write_json(out / "sentence_bert_config.json", {"max_seq_length": MAX_LEN, "do_lower_case": False})


# ---------------------------------------------------------------- the folders

def _bert_folder(out: Path, architecture: str) -> dict[str, Any]:
    tok = train_wordpiece()
    cfg = bert_config(tok.get_vocab_size(), architecture)
    write_wordpiece(out, tok)
    return cfg


def make_tiny_bert(out: Path, _tok: Any = None) -> None:
    cfg = _bert_folder(out, "BertModel")
    kit.write_json(out / "config.json", cfg)
    kit.save_tensors(dict(sorted(bert_tensors(cfg, Draw(31)).items())), out / "model.safetensors", "float32")
    write_sentence_transformers(out, [("1_Pooling", ST_POOLING), ("2_Normalize", ST_NORMALIZE)])
    kit.write_json(out / "1_Pooling" / "config.json", pooling_config(cfg["hidden_size"], "mean_tokens"))


def make_tiny_bert_cls(out: Path, _tok: Any = None) -> None:
    """CLS pooling, then a Dense module 32 -> 16 with tanh (the kind of head that LaBSE-style models carry)."""
    cfg = _bert_folder(out, "BertModel")
    kit.write_json(out / "config.json", cfg)
    draw = Draw(32)
    kit.save_tensors(dict(sorted(bert_tensors(cfg, draw).items())), out / "model.safetensors", "float32")
    write_sentence_transformers(out, [("1_Pooling", ST_POOLING), ("2_Dense", ST_DENSE),
                                      ("3_Normalize", ST_NORMALIZE)])
    h, d = cfg["hidden_size"], 16
    kit.write_json(out / "1_Pooling" / "config.json", pooling_config(h, "cls_token"))
    kit.write_json(out / "2_Dense" / "config.json",
                   {"in_features": h, "out_features": d, "bias": True,
                    "activation_function": "torch.nn.modules.activation.Tanh"})
    dense = {"linear.bias": draw.normal(d, std=0.1), "linear.weight": draw.normal(d, h, std=0.15)}
    kit.save_tensors(dense, out / "2_Dense" / "model.safetensors", "float32")


def make_tiny_bert_reranker(out: Path, _tok: Any = None) -> None:
    """A cross-encoder: the score is classifier(tanh(pooler.dense(h[CLS]))), one raw logit per pair."""
    cfg = _bert_folder(out, "BertForSequenceClassification")
    cfg["id2label"], cfg["label2id"] = {"0": "LABEL_0"}, {"LABEL_0": 0}
    kit.write_json(out / "config.json", dict(sorted(cfg.items())))
    draw = Draw(33)
    t = bert_tensors(cfg, draw, prefix="bert.")
    t["classifier.weight"] = draw.normal(1, cfg["hidden_size"], std=0.3)
    t["classifier.bias"] = draw.normal(1, std=0.1)
    kit.save_tensors(dict(sorted(t.items())), out / "model.safetensors", "float32")


ENCODER_BUILDERS = {"tiny-bert": make_tiny_bert, "tiny-bert-cls": make_tiny_bert_cls,
                    "tiny-bert-reranker": make_tiny_bert_reranker}
