"""The real models `nvllm models synthesize` copies the shape of: every hyperparameter that sets the
size and the cost of a forward pass, as each model's config.json gives it, and its special tokens."""

from __future__ import annotations

from dataclasses import dataclass, field

CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
LLAMA3 = ("{{ bos_token }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n'"
          " + m['content'] | trim + '<|eot_id|>' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")

_QWEN_SPECIALS = {151643: "<|endoftext|>", 151644: "<|im_start|>", 151645: "<|im_end|>",
                  151657: "<tool_call>", 151658: "</tool_call>"}
_QWEN3_SPECIALS = {**_QWEN_SPECIALS, 151667: "<think>", 151668: "</think>"}
_LLAMA3_SPECIALS = {128000: "<|begin_of_text|>", 128001: "<|end_of_text|>", 128006: "<|start_header_id|>",
                    128007: "<|end_header_id|>", 128008: "<|eom_id|>", 128009: "<|eot_id|>"}
_SMOLLM2_SPECIALS = {0: "<|endoftext|>", 1: "<|im_start|>", 2: "<|im_end|>"}
# Phi-4-mini: o200k's ids, then its chat markers.
_PHI4_SPECIALS = {199999: "<|endoftext|>", 200018: "<|endofprompt|>", 200019: "<|assistant|>", 200020: "<|end|>",
                  200021: "<|user|>", 200022: "<|system|>", 200023: "<|tool|>", 200024: "<|/tool|>"}
PHI4 = ("{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] + '<|end|>' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}")
# SmolLM3 keeps Llama 3's vocabulary and puts ChatML's markers in its reserved ids.
_SMOLLM3_SPECIALS = {128000: "<|begin_of_text|>", 128001: "<|end_of_text|>", 128011: "<|im_start|>",
                     128012: "<|im_end|>"}
_GEMMA3_SPECIALS = {0: "<pad>", 1: "<eos>", 2: "<bos>", 3: "<unk>", 105: "<start_of_turn>", 106: "<end_of_turn>"}
GEMMA3 = ("{{ bos_token }}{% for m in messages %}{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else "
          "m['role']) + '\n' + m['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}")


@dataclass(frozen=True)
class Shape:
    """One model's shape. `bpe` is how many ids the byte-level BPE vocabulary holds (from id `bpe_start`; for a
    `bert` shape the WordPiece pieces, [unusedN] in the ids below it); the `specials` sit at their own ids, and
    what is left of `vocab` is unused padding, as in the real file."""

    name: str
    arch: str                   # llama.cpp's: "qwen2", "qwen3", "llama", "smollm3", "phi3", "gemma3" or "bert"
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int                  # rows of the embedding
    context: int
    rope_theta: float
    norm_eps: float
    pre: str                    # tokenizer.ggml.pre
    specials: dict[int, str]
    bos: int
    eos: int
    bpe: int
    bpe_start: int = 0
    add_bos: bool = False
    chat_template: str = CHATML
    qkv_bias: bool = False
    qk_norm: bool = False
    rope_scaling: dict[str, float] = field(default_factory=dict)  # llama3's: factor, low, high, original
    rotary_dim: int = 0         # phi3: dimensions of each head rope turns (0: all)
    longrope: tuple[int, float] = (0, 0.0)   # phi3: its original context and attention factor
    sliding_window: int = 0     # gemma3's (its four norms a layer and q/k norms come with the architecture)
    pooling: int = 0            # llama.cpp's pooling_type for an embedding model (1 mean, 2 CLS, 3 last token); 0: none
    token_types: int = 0        # bert: rows of token_types.weight (config.json's type_vocab_size)

    @property
    def params(self) -> int:
        """Parameters, the tied embedding counted once (a bert file's: no pooler, as its converter drops it)."""
        h, kv = self.hidden, self.kv_heads * self.head_dim
        if self.arch == "bert":   # q, k, v, output, up and down with their biases, two norms (gain, bias) a layer
            per_layer = 4 * (h * h + h) + 2 * h * self.intermediate + self.intermediate + h + 4 * h
            return self.layers * per_layer + (self.vocab + self.context + self.token_types) * h + 2 * h
        attn = h * self.heads * self.head_dim * 2 + h * kv * 2
        per_layer = attn + 3 * h * self.intermediate + 2 * h
        if self.arch == "gemma3":   # its post-attention and post-feedforward norms, and the q/k norms
            per_layer += 2 * h + 2 * self.head_dim
        return self.layers * per_layer + self.vocab * h + h


def _qwen25(name: str, hidden: int, intermediate: int, layers: int, heads: int) -> Shape:
    return Shape(name, "qwen2", hidden, intermediate, layers, heads, 2, hidden // heads, 151936, 32768, 1e6,
                 1e-6, "qwen2", _QWEN_SPECIALS, bos=151643, eos=151645, bpe=151643, qkv_bias=True)


def _gemma3(name: str, hidden: int, intermediate: int, layers: int) -> Shape:
    """Gemma 3's text models as their config.json gives them (the 1B's and the 270M's), with a byte-level BPE
    in place of their SentencePiece vocabulary of the same size (nvllm reads only the former from a GGUF)."""
    return Shape(name, "gemma3", hidden, intermediate, layers, 4, 1, 256, 262144, 32768, 1e6, 1e-6, "smollm",
                 _GEMMA3_SPECIALS, bos=2, eos=106, bpe=262144 - 107, bpe_start=107, add_bos=True,
                 chat_template=GEMMA3, qk_norm=True, sliding_window=512)


def _qwen3(name: str, hidden: int, intermediate: int) -> Shape:
    return Shape(name, "qwen3", hidden, intermediate, 28, 16, 8, 128, 151936, 40960, 1e6, 1e-6, "qwen2",
                 _QWEN3_SPECIALS, bos=151643, eos=151645, bpe=151643, qk_norm=True)


# Qwen3-Embedding-0.6B's config.json: Qwen3-0.6B's layers, a vocabulary cut to 151,669 rows, 32k positions; its
# GGUF says last-token pooling (llama.cpp's converter writes qwen3.pooling_type 3 for it).
QWEN3_EMBEDDING = Shape("qwen3-embedding-0.6b", "qwen3", 1024, 3072, 28, 16, 8, 128, 151669, 32768, 1e6, 1e-6,
                        "qwen2", _QWEN3_SPECIALS, bos=151643, eos=151643, bpe=151643, qk_norm=True, pooling=3)


# bert-base-uncased's special tokens, which BERT models with its vocabulary keep
_BERT_SPECIALS = {0: "[PAD]", 100: "[UNK]", 101: "[CLS]", 102: "[SEP]", 103: "[MASK]"}


def _bert(name: str, layers: int, pooling: int) -> Shape:
    """A BertModel of BERT-small's width as its config.json gives it (384 wide, 12 heads, 1536, 512 positions, 2
    token types, layer_norm_eps 1e-12) with bert-base-uncased's 30,522-token WordPiece vocabulary ([unusedN] and
    the specials below id 999, the pieces past it); pooling as its sentence-transformers folder says and llama.cpp's
    converter writes it (bert.pooling_type 1 mean, 2 CLS). tokenizer.ggml.pre is "bert-bge": the converter names
    the pre-tokenizer by the ids bge-small-en-v1.5's tokenizer gives its test text, which every uncased BERT
    tokenizer with that vocabulary gives too. rope_theta is unused (no rope)."""
    return Shape(name, "bert", 384, 1536, layers, 12, 12, 32, 30522, 512, 0.0, 1e-12, "bert-bge", _BERT_SPECIALS,
                 bos=101, eos=102, bpe=30522 - 999, bpe_start=999, chat_template="", pooling=pooling, token_types=2)


SHAPES: dict[str, Shape] = {s.name: s for s in [
    _qwen25("qwen2.5-0.5b", 896, 4864, 24, 14),
    _qwen25("qwen2.5-1.5b", 1536, 8960, 28, 12),
    _qwen25("qwen2.5-3b", 2048, 11008, 36, 16),
    _qwen3("qwen3-0.6b", 1024, 3072),
    _qwen3("qwen3-1.7b", 2048, 6144),
    Shape("llama-3.2-1b", "llama", 2048, 8192, 16, 32, 8, 64, 128256, 131072, 500000.0, 1e-5, "llama-bpe",
          _LLAMA3_SPECIALS, bos=128000, eos=128009, bpe=128000, add_bos=True, chat_template=LLAMA3,
          rope_scaling={"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                        "original_max_position_embeddings": 8192.0}),
    Shape("smollm2-135m", "llama", 576, 1536, 30, 9, 3, 64, 49152, 8192, 100000.0, 1e-5, "smollm",
          _SMOLLM2_SPECIALS, bos=1, eos=2, bpe=49152 - 17, bpe_start=17),
    Shape("smollm2-360m", "llama", 960, 2560, 32, 15, 5, 64, 49152, 8192, 100000.0, 1e-5, "smollm",
          _SMOLLM2_SPECIALS, bos=1, eos=2, bpe=49152 - 17, bpe_start=17),
    # Phi-4-mini-instruct's config.json: partial rotary 0.75, longrope from 4k (attention factor
    # sqrt(1 + ln 32 / ln 4096)), tied embeddings; its o200k vocabulary is a byte-level BPE of the same size here.
    Shape("phi-4-mini", "phi3", 3072, 8192, 32, 24, 8, 128, 200064, 131072, 10000.0, 1e-5, "gpt-4o",
          _PHI4_SPECIALS, bos=199999, eos=200020, bpe=199999, chat_template=PHI4, rotary_dim=96,
          longrope=(4096, 1.1902380714238083)),
    # SmolLM3-3B's config.json; every 4th layer NoPE, which llama.cpp assumes for smollm3 (no key for it).
    Shape("smollm3-3b", "smollm3", 2048, 11008, 36, 16, 4, 128, 128256, 65536, 5000000.0, 1e-6, "llama-bpe",
          _SMOLLM3_SPECIALS, bos=128000, eos=128012, bpe=128000),
    _gemma3("gemma-3-1b", 1152, 6912, 26),
    _gemma3("gemma-3-270m", 640, 2048, 18),
    QWEN3_EMBEDDING,
    _bert("bge-small-en-v1.5", 12, pooling=2),
    _bert("all-minilm-l6-v2", 6, pooling=1),
]}
