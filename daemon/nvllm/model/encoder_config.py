"""An encoder's configuration (the BERT family: BERT, XLM-RoBERTa, NomicBert): config.json (or a GGUF's header)
-> EncoderConfig. Encoders read a whole sequence at once, every token seeing every other, and keep no cache:
their shape shares little with the decoders' ModelConfig, so it is a type of its own.

NomicBert (nomic-embed-text) writes its config.json in its own keys (n_embd, n_layer, rotary_emb_*, ...), read by
_nomic_bert; what it differs in is a field here: rotary positions over rotary_dim of each head in place of the
position table, a SwiGLU MLP, no biases where qkv_proj_bias / mlp_fc1_bias / mlp_fc2_bias say so."""

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
    "NomicBertModel": ("nomic-bert", ""),
}
# Encoders nvllm does not serve, refused by name rather than as an unknown architecture.
REFUSED_ENCODERS = ("DistilBertModel", "RobertaModel", "ElectraModel", "DebertaV2Model", "ModernBertModel",
                    "T5EncoderModel", "MPNetModel", "CLIPTextModel")
GELU_ACTS = ("gelu",)   # transformers' "gelu": the exact erf form
NOMIC_MLPS = ("swiglu",)


@dataclass(frozen=True)
class EncoderConfig:
    architecture: str
    family: str                 # "bert", "xlm-roberta" or "nomic-bert"
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
    # Rotary positions (NomicBert): the first rotary_dim values of each head's q and k rotated, NeoX's halves
    # (or adjacent pairs where interleaved); 0: the absolute position table instead.
    rotary_dim: int = 0
    rope_theta: float = 10000.0
    rope_interleaved: bool = False
    mlp: str = "gelu"           # "gelu" (up, GELU, down) or "swiglu" (down(up(x) * silu(gate(x))))
    attention_bias: bool = True  # q, k, v and the output projection's
    up_bias: bool = True        # the MLP's first layer (gate and up)
    down_bias: bool = True

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
        ups = 2 if self.mlp == "swiglu" else 1
        per_layer = (4 * h * h + 4 * h * self.attention_bias + (ups + 1) * h * i + ups * i * self.up_bias
                     + h * self.down_bias + 4 * h)
        table = 0 if self.rotary_dim else self.max_position_embeddings
        embed = (self.vocab_size + table + self.type_vocab_size) * h + 2 * h
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
        if family == "nomic-bert":
            return _nomic_bert(cfg, where)

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


def _nomic_bert(cfg: dict[str, Any], where: str) -> EncoderConfig:
    """NomicBertModel's config.json (nomic's keys, as nomic-embed-text-v1 / v1.5 write them). What its
    reference code can do and nvllm does not is refused by name: pre-norm or parallel blocks, RMSNorm, scaled
    rotary (dynamic NTK, xPos), causal attention, MoE layers, an MLP other than SwiGLU."""
    def need(key: str) -> Any:
        if cfg.get(key) is None:
            raise ModelLoadError(f"{where}: missing {key!r}")
        return cfg[key]

    for key, plain in (("prenorm", False), ("parallel_block", False), ("use_rms_norm", False), ("causal", False),
                       ("rotary_scaling_factor", None), ("rotary_emb_scale_base", None), ("moe_every_n_layers", 0)):
        if cfg.get(key) not in (None, plain):
            raise ModelLoadError(f"{where}: {key} {cfg[key]!r} is not supported (supported: {plain!r})")
    act = cfg.get("activation_function", "swiglu")
    if act not in NOMIC_MLPS:
        raise ModelLoadError(f"{where}: activation_function {act!r} is not supported (supported: "
                             f"{', '.join(NOMIC_MLPS)})")
    hidden, heads = int(need("n_embd")), int(need("n_head"))
    if hidden % heads:
        raise ModelLoadError(f"{where}: n_embd {hidden} is not a multiple of n_head {heads}")
    fraction = float(need("rotary_emb_fraction"))
    rotary = int(hidden // heads * fraction)
    if not 0 < rotary <= hidden // heads or rotary % 2:
        raise ModelLoadError(f"{where}: rotary_emb_fraction {fraction} gives {rotary} rotary values of a "
                             f"{hidden // heads}-value head; it needs an even number, at least 2")
    # Trained for max_trained_positions (2048 for nomic-embed-text v1 and v1.5, as llama.cpp's converter has it).
    longest = min(int(cfg.get("n_positions", 2048)), int(cfg.get("max_trained_positions", 2048)))
    return EncoderConfig(
        architecture="NomicBertModel", family="nomic-bert", vocab_size=int(need("vocab_size")), hidden_size=hidden,
        intermediate_size=int(cfg.get("n_inner") or 4 * hidden), num_layers=int(need("n_layer")), num_heads=heads,
        max_position_embeddings=longest, type_vocab_size=int(cfg.get("type_vocab_size", 2)),
        layer_norm_eps=float(cfg.get("layer_norm_epsilon", 1e-5)), pad_token_id=int(cfg.get("pad_token_id") or 0),
        rotary_dim=rotary, rope_theta=float(need("rotary_emb_base")),
        rope_interleaved=bool(cfg.get("rotary_emb_interleaved", False)), mlp=act,
        attention_bias=bool(cfg.get("qkv_proj_bias", True)), up_bias=bool(cfg.get("mlp_fc1_bias", True)),
        down_bias=bool(cfg.get("mlp_fc2_bias", True)))


def is_encoder(cfg: dict[str, Any]) -> bool:
    """Whether config.json names an encoder, served or refused."""
    archs = cfg.get("architectures") or []
    return bool(archs) and (archs[0] in ENCODER_ARCHITECTURES or archs[0] in REFUSED_ENCODERS)
