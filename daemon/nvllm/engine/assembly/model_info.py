"""What callers above the engine may know of a model, without its weights: its shape, what its weights
and its page pool take, and how many pages a sequence may hold (for logs, --dry-run, the bench and the
sizing: engine/assembly/factory.py)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

from nvllm.model.config import ModelConfig
from nvllm.model.kv_cache import KVCache
from nvllm.model.kv_layout import KVLayout
from nvllm.model.quant.kv_format import F32, KVFormat


@dataclass(frozen=True)
class ModelInfo:
    """What callers above the engine may know of a model: for logs, --dry-run and the bench."""
    path: Path
    architecture: str
    num_layers: int
    num_params: int
    vocab_size: int
    hidden_size: int
    max_position_embeddings: int
    weight_bytes: int
    bytes_per_token: int          # KV pool bytes per token of a page (one group's layers), in kv_format
    weight_format: str = "float32"   # how the weights are held, in words: "float32", "q8_0 (model.quantization)"
    # The most the weights take while loading: a folder's matrices converted at load (quantized, or kept
    # in 16 bits) are each read as float32 first, one at a time.
    load_peak_bytes: int = 0
    kv_format: KVFormat = F32     # what the pool stores keys and values in (cache.dtype)
    num_kv_heads: int = 0         # with head_dim: a token's keys and values, for the pool in another format
    head_dim: int = 0
    pinned_blocks: int = 0        # pages the pinned prompts hold for good (cache.pinned_prompts)
    draft_pool_bytes: int = 0     # the draft model's own pool (speculative.draft_model), taken off the reading
    kv_slots: int = 0             # layers per page (model/kv_layout.py; 0: every layer)
    kv_windows: tuple[int, ...] = (0,)   # per group of layers: the keys a query sees (0: all)
    task: str = "generate"        # or "embed", "rerank": a pooling model's (bytes_per_token 0 for an encoder);
    #                               "transcribe": a speech model's (engine/assembly/speech_model.py)
    cross_bytes: int = 0          # a speech model's cross-attention keys and values, every seat's, beside the pool

    @classmethod
    def of(cls, path: Path, c: ModelConfig, weight_bytes: int | None = None,
           weight_format: str = "float32", load_peak_bytes: int = 0, kv_format: KVFormat = F32,
           layout: KVLayout | None = None) -> ModelInfo:
        """layout: the pool's groups of layers (None: the config's, model/kv_layout.py)."""
        weights = c.weight_bytes if weight_bytes is None else weight_bytes
        layout = layout or KVLayout.of(c)
        info = cls(path, c.architecture, c.num_layers, c.num_params, c.vocab_size, c.hidden_size,
                   c.max_position_embeddings, weights, 0, weight_format, max(weights, load_peak_bytes),
                   kv_format, c.num_kv_heads, c.head_dim, kv_slots=layout.slots, kv_windows=layout.windows)
        return dataclasses.replace(info, bytes_per_token=info.kv_bytes_per_token(kv_format))

    def kv_bytes_per_token(self, fmt: KVFormat, slots: int | None = None) -> int:
        """The pool's bytes per token of a page in KV format fmt, of `slots` layers (None: the layout's)."""
        slots = slots or self.kv_slots or self.num_layers
        return KVCache.bytes_per_block(slots, 1, self.num_kv_heads, self.head_dim, fmt)

    def blocks_for(self, num_tokens: int, block_size: int, chunk: int) -> int:
        """Pages one sequence of num_tokens, computed chunk tokens a step at most, may hold at once: per group
        of layers, its context's or, for a sliding group, its window's and a chunk's (with the null page:
        engine/block_manager.py)."""
        per = math.ceil(num_tokens / block_size)
        window = [min(per, math.ceil((w - 1 + chunk) / block_size) + 2) for w in self.kv_windows if w]
        return per * self.kv_windows.count(0) + sum(window) + bool(window)

    def longest_in(self, num_blocks: int, block_size: int, chunk: int) -> int:
        """The longest sequence num_blocks pages hold (blocks_for's inverse)."""
        lo, hi = 0, num_blocks * block_size
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if self.blocks_for(mid, block_size, chunk) <= num_blocks else (lo, mid - 1)
        return lo

    @property
    def kv_groups(self) -> int:
        return len(self.kv_windows)
