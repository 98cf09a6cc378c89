"""An encoder GGUF (llama.cpp's arch `bert`, as its convert_hf_to_gguf.py writes BertModel,
BertForSequenceClassification and XLM-RoBERTa's two; `nomic-bert`, NomicBertModel) read as llama.cpp reads
it: the hyperparameters from `{arch}.*`, the vocabulary size from token_embd's rows and the token types from
token_types' rows, every tensor's shape checked against them before anything is allocated
(gguf_file.open_gguf checked the header and the bytes), then the weights laid out by Hugging Face name
(encoder_layout.py; nomic's own names for nomic-bert) through gguf_weights.py, the matrices in a format the C
kernels multiply kept in place.

The vocabulary is BERT's WordPiece ("bert") or XLM-R's SentencePiece Unigram ("t5"). An XLM-R file's position
table starts at the first real position (the converter drops RoBERTa's pad_token_id + 1 rows before it), so
its positions count from 0 as BERT's do. A nomic-bert file has no position table: rotary positions over
`rope.dimension_count` of each head (the head by default), NeoX's halves, base `rope.freq_base`; q|k|v fused
(attn_qkv), a SwiGLU MLP (ffn_gate, ffn_up, ffn_down) with no biases (llama.cpp adds none there), attention
biases where the file has them.

What llama.cpp does and nvllm follows: the pooling is `bert.pooling_type` (1 mean, 2 cls, 3 last, 4 rank),
L2-normalized for an embedder (llama.cpp's default); 0 (none: a vector per token) is refused. A file
with a classifier (cls.output) and no pooling key is a reranker (llama.cpp needs `--pooling rank` for it):
the classifier on the first token's state, after the file's `cls` dense and tanh where it has one (the
converter drops BERT's pooler, so it usually has none; XLM-R's head keeps its dense). No Q/K rows are
unpermuted: the converter permutes neither arch's. Other encoder architectures (jina-bert-v2, ...) are refused
by name.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

from nvllm.model.encoder_config import EncoderConfig
from nvllm.model.pooler import Pooling
from nvllm.model.weights.encoder_layout import EncoderWeights, lay_out_encoder
from nvllm.model.weights.gguf_config import ENCODER_ARCHITECTURES, REFUSED_ENCODERS, Meta
from nvllm.model.weights.gguf_file import GGUFFile, open_gguf
from nvllm.model.weights.gguf_names import bert_tensor_name, nomic_bert_tensor_name
from nvllm.model.weights.gguf_reader import GGUFError, TensorInfo
from nvllm.model.weights.gguf_weights import lay_out_gguf, resident_bytes

# llama.cpp's enum llama_pooling_type (0 none; 4 rank: a classifier's score)
POOLING_TYPES = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}
_HEAD = ("cls.weight", "cls.bias", "cls.output.weight", "cls.output.bias")


def is_gguf_encoder(metadata: Mapping[str, Any]) -> bool:
    """Whether a GGUF's metadata names an encoder architecture, served (bert, nomic-bert) or refused by name:
    such a file goes to load_gguf_encoder, not to the decoder's read_gguf."""
    arch = metadata.get("general.architecture")
    return arch in ENCODER_ARCHITECTURES or arch in REFUSED_ENCODERS


@dataclass
class GGUFEncoder:
    """A bert GGUF checked whole (hyperparameters, pooling, every tensor's shape), its weights not read."""
    file: GGUFFile
    config: EncoderConfig
    pooling: Pooling

    def resident_bytes(self, in_place: bool | None = None) -> int:
        """The bytes load_gguf_encoder will hold (its EncoderWeights.nbytes): for planning memory."""
        nomic = self.config.family == "nomic-bert"
        groups = [["token_embd.weight"], ["token_types.weight"]] + ([] if nomic else [["position_embd.weight"]])
        for n in range(self.config.num_layers):
            p = f"blk.{n}."
            qkv = [p + "attn_qkv.weight"] if nomic else [p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"]
            up = [p + "ffn_gate.weight", p + "ffn_up.weight"] if nomic else [p + "ffn_up.weight"]
            groups += [qkv, [p + "attn_output.weight"], up, [p + "ffn_down.weight"]]
        head = [n for n in _HEAD if n in self.file.tensors]
        if self.config.head:
            groups += [[n] for n in head if n.endswith(".weight")]
        return resident_bytes(self.file, groups, () if self.config.head else head, in_place)


class GGUFEncoderModel(NamedTuple):
    config: EncoderConfig
    weights: EncoderWeights
    pooling: Pooling
    metadata: dict[str, Any]   # the file's keys, the tokenizer's among them (Tokenizer.from_gguf_metadata)


def read_gguf_encoder(path: str | Path | GGUFFile) -> GGUFEncoder:
    """A bert GGUF (a path, or a file open_gguf opened) checked whole; a file opened here is unmapped
    again when refused."""
    if isinstance(path, GGUFFile):
        return _read(path)
    f = open_gguf(path)
    try:
        return _read(f)
    except BaseException:
        f.close()
        raise


def load_gguf_encoder(path: str | Path | GGUFFile, in_place: bool | None = None) -> GGUFEncoderModel:
    """An encoder GGUF's config, weights (in place where the C kernels multiply their format; in_place as
    gguf_weights.lay_out_gguf takes it), pooling and metadata: Encoder(config, weights, pooling) runs it,
    Tokenizer.from_gguf_metadata(metadata, ...) tokenizes for it."""
    e = read_gguf_encoder(path)
    f = e.file
    hf_name = nomic_bert_tensor_name if e.config.family == "nomic-bert" else bert_tensor_name
    names = {hf_name(n): n for n in f.tensors}
    weights = lay_out_gguf(f, names, {}, lambda t: lay_out_encoder(t, e.config, str(f.path), pooler_optional=True),
                           in_place)
    return GGUFEncoderModel(e.config, weights, e.pooling, f.metadata)


def _read(f: GGUFFile) -> GGUFEncoder:
    arch = f.architecture
    if arch is None:
        raise GGUFError(f"{f.path}: metadata 'general.architecture' is missing")
    if arch in REFUSED_ENCODERS:
        raise GGUFError(f"{f.path}: architecture {arch!r} is an encoder nvllm does not serve "
                        f"(encoders served: {', '.join(ENCODER_ARCHITECTURES)})")
    if arch not in ENCODER_ARCHITECTURES:
        raise GGUFError(f"{f.path}: architecture {arch!r} is not an encoder "
                        f"(encoders served: {', '.join(ENCODER_ARCHITECTURES)})")
    m = Meta(f.metadata, arch, f.path)
    _check_tokenizer(m)
    config, labels = _config(m, f.infos)
    pooling = _pooling(m, labels)
    if pooling is None:   # a reranker: the classifier scores the first token's state; the pooling goes unused
        if config.family != "bert":
            raise m.fail("a nomic-bert file with a classifier: only bert rerankers are served")
        config = replace(config, architecture="BertForSequenceClassification", head="bert", num_labels=1)
        pooling = Pooling("cls", normalize=False)
    _check_tensors(m, config, labels, f.infos)
    return GGUFEncoder(f, config, pooling)


# The vocabularies nvllm rebuilds for an encoder: BERT's WordPiece, XLM-RoBERTa's SentencePiece Unigram.
TOKENIZER_MODELS = ("bert", "t5")


def _check_tokenizer(m: Meta) -> None:
    """Refused before the weights are read."""
    kind = m.m.get("tokenizer.ggml.model")
    if kind not in TOKENIZER_MODELS:
        raise m.fail(f"metadata 'tokenizer.ggml.model' is {kind!r}: nvllm reads an encoder's WordPiece ('bert') "
                     "or SentencePiece Unigram ('t5') vocabulary")


def _rows(m: Meta, infos: dict[str, TensorInfo], name: str) -> int:
    t = infos.get(name)
    if t is None:
        raise m.fail(f"tensor {name!r} is missing")
    return t.shape[0]


def _config(m: Meta, infos: dict[str, TensorInfo]) -> tuple[EncoderConfig, int]:
    """The EncoderConfig a bert file's keys and tensors give, and its classifier's labels (0: none)."""
    hidden = m.positive("embedding_length")
    heads = m.positive("attention.head_count", limit=hidden)
    if hidden % heads:
        raise m.fail(f"embedding length {hidden} is not a multiple of the {heads} attention heads")
    kv_heads = m.positive("attention.head_count_kv", heads, limit=hidden)
    if kv_heads != heads:
        raise m.fail(f"{kv_heads} key/value heads for {heads} attention heads: a bert encoder has one per head")
    causal = m.m.get(f"{m.arch}.attention.causal", False)
    if causal is not False:
        raise m.fail(f"metadata '{m.arch}.attention.causal' is {causal!r}: a bert encoder attends both ways")
    vocab = _rows(m, infos, "token_embd.weight")
    tokens = m.m.get("tokenizer.ggml.tokens")
    if isinstance(tokens, list) and len(tokens) > vocab:
        raise m.fail(f"{len(tokens)} tokens but the embedding has {vocab} rows")
    types = _rows(m, infos, "token_types.weight")
    counted = m.get("tokenizer.ggml.token_type_count", int, types)
    if counted != types:
        raise m.fail(f"metadata 'tokenizer.ggml.token_type_count' is {counted}, but tensor 'token_types.weight' "
                     f"has {types} rows")
    pad = m.get("tokenizer.ggml.padding_token_id", int, 0)
    if not 0 <= pad < vocab:
        raise m.fail(f"metadata 'tokenizer.ggml.padding_token_id' is {pad}, not a token id (0 to {vocab - 1})")
    labels = 0
    if "cls.output.weight" in infos:
        names = m.get("classifier.output_labels", list, [""] * _rows(m, infos, "cls.output.weight"))
        if not (names and all(isinstance(n, str) for n in names)):
            raise m.fail(f"metadata '{m.arch}.classifier.output_labels' is not a list of label names")
        labels = len(names)
    config = EncoderConfig(
        architecture="BertModel", family="bert", vocab_size=vocab, hidden_size=hidden,
        intermediate_size=m.positive("feed_forward_length"), num_layers=m.positive("block_count", limit=len(infos)),
        num_heads=heads, max_position_embeddings=m.positive("context_length"), type_vocab_size=types,
        layer_norm_eps=m.finite("attention.layer_norm_epsilon"), pad_token_id=pad)
    if m.arch == "nomic-bert":
        config = _nomic(m, config, infos)
    return config, labels


def _nomic(m: Meta, c: EncoderConfig, infos: dict[str, TensorInfo]) -> EncoderConfig:
    """A nomic-bert file's differences from bert's, as llama.cpp's loader reads them."""
    head_dim = c.hidden_size // c.num_heads
    rotary = m.positive("rope.dimension_count", head_dim, limit=head_dim)
    if rotary % 2:
        raise m.fail(f"metadata '{m.arch}.rope.dimension_count' is {rotary}: rotary positions need pairs")
    return replace(c, architecture="NomicBertModel", family="nomic-bert", rotary_dim=rotary,
                   rope_theta=m.finite("rope.freq_base", 10000.0), mlp="swiglu",
                   attention_bias="blk.0.attn_qkv.bias" in infos, up_bias=False, down_bias=False)


def _pooling(m: Meta, labels: int) -> Pooling | None:
    """The file's pooling as llama.cpp applies it; None for rank (a reranker's classifier)."""
    kind = m.get("pooling_type", int, required=False)
    if kind is None:
        if not labels:
            raise m.fail(f"metadata '{m.arch}.pooling_type' is missing and the file has no classifier "
                         "(cls.output): llama.cpp would give a vector per token (pooling none); nvllm serves "
                         "one per sequence")
        kind = 4   # a classifier's file: its converter writes no pooling key (llama.cpp: --pooling rank)
    if kind not in POOLING_TYPES:
        raise m.fail(f"metadata '{m.arch}.pooling_type' is {kind}, not one of llama.cpp's pooling types (0 to 4)")
    name = POOLING_TYPES[kind]
    if name == "none":
        raise m.fail(f"metadata '{m.arch}.pooling_type' is 0 (none): a vector per token; nvllm serves one per "
                     "sequence (mean 1, cls 2, last 3, rank 4)")
    if name != "rank":
        return Pooling(name, normalize=True)
    if not labels:
        raise m.fail(f"metadata '{m.arch}.pooling_type' is 4 (rank) but tensor 'cls.output.weight' (the "
                     "classifier) is missing")
    if labels != 1:
        raise m.fail(f"a classifier with {labels} labels; only one-label classifiers (rerankers) are served")
    return None


def _expected_shapes(c: EncoderConfig, labels: int, infos: dict[str, TensorInfo]) -> dict[str, tuple[int, ...]]:
    """Every tensor llama.cpp's bert (nomic-bert) loader reads (NumPy order), the classifier's where the file
    has it."""
    H, F = c.hidden_size, c.intermediate_size
    want: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (c.vocab_size, H), "token_types.weight": (c.type_vocab_size, H),
        "token_embd_norm.weight": (H,), "token_embd_norm.bias": (H,)}
    if c.family == "nomic-bert":
        return want | _nomic_shapes(c)
    want["position_embd.weight"] = (c.max_position_embeddings, H)
    for n in range(c.num_layers):
        p = f"blk.{n}."
        for kind, out, inp in (("attn_q", H, H), ("attn_k", H, H), ("attn_v", H, H), ("attn_output", H, H),
                               ("ffn_up", F, H), ("ffn_down", H, F)):
            want.update({f"{p}{kind}.weight": (out, inp), f"{p}{kind}.bias": (out,)})
        for norm in ("attn_output_norm", "layer_output_norm"):
            want.update({f"{p}{norm}.weight": (H,), f"{p}{norm}.bias": (H,)})
    if labels:   # the classifier with its bias; the dense before it (llama.cpp's cls) when there is one
        want.update({"cls.output.weight": (labels, H), "cls.output.bias": (labels,)})
    if "cls.weight" in infos or "cls.bias" in infos:
        want.update({"cls.weight": (H, H), "cls.bias": (H,)})
    return want


def _nomic_shapes(c: EncoderConfig) -> dict[str, tuple[int, ...]]:
    H, F = c.hidden_size, c.intermediate_size
    want: dict[str, tuple[int, ...]] = {}
    for n in range(c.num_layers):
        p = f"blk.{n}."
        want.update({f"{p}attn_qkv.weight": (3 * H, H), f"{p}attn_output.weight": (H, H),
                     f"{p}ffn_gate.weight": (F, H), f"{p}ffn_up.weight": (F, H), f"{p}ffn_down.weight": (H, F)})
        if c.attention_bias:
            want.update({f"{p}attn_qkv.bias": (3 * H,), f"{p}attn_output.bias": (H,)})
        for norm in ("attn_output_norm", "layer_output_norm"):
            want.update({f"{p}{norm}.weight": (H,), f"{p}{norm}.bias": (H,)})
    return want


def _check_tensors(m: Meta, c: EncoderConfig, labels: int, infos: dict[str, TensorInfo]) -> None:
    want = _expected_shapes(c, labels, infos)
    for name, shape in want.items():
        t = infos.get(name)
        if t is None:
            raise m.fail(f"tensor {name!r} is missing")
        if t.shape != shape:
            raise m.fail(f"tensor {name!r} has shape {list(t.shape)}, expected {list(shape)} from the "
                         "hyperparameters")
    extra = sorted(set(infos) - set(want))
    if extra:
        raise m.fail(f"unexpected tensor {extra[0]!r} for a {c.num_layers}-layer {m.arch} model")
