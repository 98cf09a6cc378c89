"""An encoder's weights (the BERT family) as every reader lays them out, by Hugging Face name: a folder's
reader (weights/folder.py) and a GGUF's (weights/gguf_weights.py) answer the same TensorReader calls. BERT and
XLM-RoBERTa go by transformers' names, NomicBert by nomic's own (a GGUF's names are mapped to these in
gguf_names.py)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nvllm.model.config import ModelLoadError
from nvllm.model.encoder_config import EncoderConfig
from nvllm.model.matrix.weight import Weight
from nvllm.model.weights.layout import Parts, TensorReader


@dataclass
class EncoderLayer:
    """A post-norm layer: x = LN(x + attention(x)); x = LN(x + down(mlp(up(x)))), the MLP GELU, or SwiGLU on
    up's gate|up halves. A bias is None where the model has none (NomicBert's)."""
    qkv: Weight                # (3H, H), q then k then v
    qkv_bias: np.ndarray | None   # [3H]
    o: Weight                  # (H, H)
    o_bias: np.ndarray | None
    attn_norm: tuple[np.ndarray, np.ndarray]   # LayerNorm's weight and bias [H]
    up: Weight                 # (I, H); SwiGLU: (2I, H), gate then up
    up_bias: np.ndarray | None
    down: Weight               # (H, I)
    down_bias: np.ndarray | None
    ffn_norm: tuple[np.ndarray, np.ndarray]


@dataclass
class ClassifierHead:
    """A cross-encoder's head on its first token's state: tanh(dense(h)) then out (BERT's pooler and
    classifier, RoBERTa's dense and out_proj: the same arithmetic). A GGUF from llama.cpp's converter has
    no pooler (dense None): out(h), as llama.cpp scores it."""
    out: Weight                # (num_labels, H)
    out_bias: np.ndarray
    dense: Weight | None = None
    dense_bias: np.ndarray | None = None


@dataclass
class EncoderWeights:
    embed: Weight              # (V, H)
    positions: Weight | None   # (max_position_embeddings, H); None with rotary positions
    token_types: Weight        # (type_vocab_size, H)
    embed_norm: tuple[np.ndarray, np.ndarray]
    layers: list[EncoderLayer]
    head: ClassifierHead | None = None

    @property
    def nbytes(self) -> int:
        total = sum(w.nbytes for w in (self.embed, self.positions, self.token_types) if w is not None)
        total += sum(a.nbytes for a in self.embed_norm)
        for layer in self.layers:
            for v in vars(layer).values():
                total += sum(a.nbytes for a in v) if isinstance(v, tuple) else 0 if v is None else v.nbytes
        if self.head is not None:
            total += sum(v.nbytes for v in vars(self.head).values() if v is not None)
        return total


# Where the encoder's own tensors are: BertModel and XLMRobertaModel save them at the top, the sequence
# classifiers under their base model's name.
_PREFIXES = {"bert": ("", "bert."), "xlm-roberta": ("", "roberta.")}


def lay_out_encoder(t: TensorReader, c: EncoderConfig, where: str, pooler_optional: bool = False) -> EncoderWeights:
    """The encoder's weights from `t` (Hugging Face names). pooler_optional: a BERT head without its pooler
    is the classifier alone (a GGUF: llama.cpp's converter drops BERT's pooler, and llama.cpp scores
    without it); a folder's must have it."""
    if c.family == "nomic-bert":
        return _lay_out_nomic(t, c)
    prefixes = _PREFIXES[c.family]
    found = [p for p in prefixes if f"{p}embeddings.word_embeddings.weight" in t]
    if not found:
        raise ModelLoadError(f"{where}: no {prefixes[-1]}embeddings.word_embeddings.weight: not a {c.family} "
                             f"checkpoint")
    p = found[0]
    H, F = c.hidden_size, c.intermediate_size

    def norm(name: str) -> tuple[np.ndarray, np.ndarray]:
        return t.get(f"{name}.weight", (H,)), t.get(f"{name}.bias", (H,))

    layers = []
    for n in range(c.num_layers):
        q = f"{p}encoder.layer.{n}."
        parts: Parts = [(f"{q}attention.self.{x}.weight", (H, H)) for x in ("query", "key", "value")]
        layers.append(EncoderLayer(
            qkv=t.joined(parts),
            qkv_bias=np.concatenate([t.get(f"{q}attention.self.{x}.bias", (H,)) for x in ("query", "key", "value")]),
            o=t.get(f"{q}attention.output.dense.weight", (H, H)), o_bias=t.get(f"{q}attention.output.dense.bias", (H,)),
            attn_norm=norm(f"{q}attention.output.LayerNorm"),
            up=t.get(f"{q}intermediate.dense.weight", (F, H)), up_bias=t.get(f"{q}intermediate.dense.bias", (F,)),
            down=t.get(f"{q}output.dense.weight", (H, F)), down_bias=t.get(f"{q}output.dense.bias", (H,)),
            ffn_norm=norm(f"{q}output.LayerNorm")))
    head = None
    if c.head == "bert":
        head = ClassifierHead(t.get("classifier.weight", (c.num_labels, H)), t.get("classifier.bias", (c.num_labels,)))
        if not pooler_optional or f"{p}pooler.dense.weight" in t:
            head.dense, head.dense_bias = t.get(f"{p}pooler.dense.weight", (H, H)), t.get(f"{p}pooler.dense.bias", (H,))
    elif c.head == "roberta":
        head = ClassifierHead(t.get("classifier.out_proj.weight", (c.num_labels, H)),
                              t.get("classifier.out_proj.bias", (c.num_labels,)),
                              t.get("classifier.dense.weight", (H, H)), t.get("classifier.dense.bias", (H,)))
    e = f"{p}embeddings."
    return EncoderWeights(
        embed=t.get(f"{e}word_embeddings.weight", (c.vocab_size, H)),
        positions=t.get(f"{e}position_embeddings.weight", (c.max_position_embeddings, H)),
        token_types=t.get(f"{e}token_type_embeddings.weight", (c.type_vocab_size, H)),
        embed_norm=norm(f"{e}LayerNorm"), layers=layers, head=head)


def _lay_out_nomic(t: TensorReader, c: EncoderConfig) -> EncoderWeights:
    """NomicBertModel's tensors by nomic's names: q|k|v in one matrix (attn.Wqkv), the SwiGLU's gate (fc12)
    and up (fc11) read as one (2I, H) matrix, biases only where the config has them, no position table."""
    H, F = c.hidden_size, c.intermediate_size

    def norm(name: str) -> tuple[np.ndarray, np.ndarray]:
        return t.get(f"{name}.weight", (H,)), t.get(f"{name}.bias", (H,))

    def bias(name: str, n: int, present: bool) -> np.ndarray | None:
        return t.get(f"{name}.bias", (n,)) if present else None

    layers = []
    for n in range(c.num_layers):
        q = f"encoder.layers.{n}."
        gate_up: Parts = [(f"{q}mlp.fc12.weight", (F, H)), (f"{q}mlp.fc11.weight", (F, H))]
        up_bias = None
        if c.up_bias:
            up_bias = np.concatenate([t.get(f"{q}mlp.fc12.bias", (F,)), t.get(f"{q}mlp.fc11.bias", (F,))])
        layers.append(EncoderLayer(
            qkv=t.get(f"{q}attn.Wqkv.weight", (3 * H, H)), qkv_bias=bias(f"{q}attn.Wqkv", 3 * H, c.attention_bias),
            o=t.get(f"{q}attn.out_proj.weight", (H, H)), o_bias=bias(f"{q}attn.out_proj", H, c.attention_bias),
            attn_norm=norm(f"{q}norm1"), up=t.joined(gate_up), up_bias=up_bias,
            down=t.get(f"{q}mlp.fc2.weight", (H, F)), down_bias=bias(f"{q}mlp.fc2", H, c.down_bias),
            ffn_norm=norm(f"{q}norm2")))
    return EncoderWeights(
        embed=t.get("embeddings.word_embeddings.weight", (c.vocab_size, H)), positions=None,
        token_types=t.get("embeddings.token_type_embeddings.weight", (c.type_vocab_size, H)),
        embed_norm=norm("emb_ln"), layers=layers)
