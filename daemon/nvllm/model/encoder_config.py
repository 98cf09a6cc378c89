"""An encoder's configuration (the BERT family: BERT, XLM-RoBERTa): config.json (or a GGUF's header) ->
EncoderConfig. Encoders read a whole sequence at once, every token seeing every other, and keep no cache:
their shape shares little with the decoders' ModelConfig, so it is a type of its own."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nvllm.model.config import ModelLoadError

# architecture -> (family, head): the models served for embeddings ("" head) and as cross-encoders.
ENCODER_ARCHITECTURES = {
    "BertModel": ("bert", ""),
    "BertForSequenceClassification": ("bert", "bert"),
    "XLMRobertaModel": ("xlm-roberta", ""),
    "XLMRobertaForSequenceClassification": ("xlm-roberta", "roberta"),
}
# Encoders nvllm does not serve, refused by name rather than as an unknown architecture.
REFUSED_ENCODERS = ("DistilBertModel", "RobertaModel", "ElectraModel", "DebertaV2Model", "ModernBertModel",
                    "T5EncoderModel", "MPNetModel", "CLIPTextModel")
GELU_ACTS = ("gelu",)   # transformers' "gelu": the exact erf form


@dataclass(frozen=True)
class EncoderConfig:
    architecture: str
    family: str                 # "bert" or "xlm-roberta"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    # RoBERTa counts positions from padding_idx + 1 (2 for XLM-R); BERT from 0.
    position_offset: int = 0
    head: str = ""              # "" (an embedder), "bert" (pooler + classifier) or "roberta" (dense + out_proj)
    num_labels: int = 0         # a classifier's outputs (1 for a reranker)
    pad_token_id: int = 0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def max_tokens(self) -> int:
        """The longest sequence the position table covers."""
        return self.max_position_embeddings - self.position_offset

    @property
    def num_params(self) -> int:
        h, i = self.hidden_size, self.intermediate_size
        per_layer = 4 * h * h + 4 * h + 2 * h * i + i + h + 4 * h
        embed = (self.vocab_size + self.max_position_embeddings + self.type_vocab_size) * h + 2 * h
        head = (h * h + h + self.num_labels * h + self.num_labels) if self.head else 0
        return self.num_layers * per_layer + embed + head

    @property
    def weight_bytes(self) -> int:
        return 4 * self.num_params

    @classmethod
    def from_dict(cls, cfg: dict[str, Any], where: str = "config.json") -> EncoderConfig:
        archs = cfg.get("architectures") or []
        arch = archs[0] if archs else None
        if arch not in ENCODER_ARCHITECTURES:
            raise ModelLoadError(f"{where}: encoder architecture {arch!r} is not supported (supported: "
                                 f"{', '.join(ENCODER_ARCHITECTURES)})")
        family, head = ENCODER_ARCHITECTURES[arch]

        def need(key: str) -> Any:
            if key not in cfg:
                raise ModelLoadError(f"{where}: missing {key!r}")
            return cfg[key]

        act = cfg.get("hidden_act", "gelu")
        if act not in GELU_ACTS:
            raise ModelLoadError(f"{where}: hidden_act {act!r} is not supported (supported: {', '.join(GELU_ACTS)})")
        kind = cfg.get("position_embedding_type", "absolute")
        if kind != "absolute":
            raise ModelLoadError(f"{where}: position_embedding_type {kind!r} is not supported (supported: absolute)")
        hidden, heads = int(need("hidden_size")), int(need("num_attention_heads"))
        if hidden % heads:
            raise ModelLoadError(f"{where}: hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
        labels = 0
        if head:
            labels = len(cfg.get("id2label") or {}) or int(cfg.get("num_labels", 2))
            if labels != 1:
                raise ModelLoadError(f"{where}: a sequence classifier with {labels} labels; only one-label "
                                     f"classifiers (rerankers) are served")
        pad = int(cfg.get("pad_token_id") or 0)
        config = cls(
            architecture=arch, family=family, vocab_size=int(need("vocab_size")), hidden_size=hidden,
            intermediate_size=int(need("intermediate_size")), num_layers=int(need("num_hidden_layers")),
            num_heads=heads, max_position_embeddings=int(cfg.get("max_position_embeddings", 512)),
            type_vocab_size=int(cfg.get("type_vocab_size", 2)),
            layer_norm_eps=float(cfg.get("layer_norm_eps", 1e-12)),
            position_offset=pad + 1 if family == "xlm-roberta" else 0, head=head, num_labels=labels,
            pad_token_id=pad)
        if config.max_tokens < 1:
            raise ModelLoadError(f"{where}: max_position_embeddings {config.max_position_embeddings} leaves no "
                                 f"position after the offset {config.position_offset}")
        return config


def is_encoder(cfg: dict[str, Any]) -> bool:
    """Whether config.json names an encoder, served or refused."""
    archs = cfg.get("architectures") or []
    return bool(archs) and (archs[0] in ENCODER_ARCHITECTURES or archs[0] in REFUSED_ENCODERS)
