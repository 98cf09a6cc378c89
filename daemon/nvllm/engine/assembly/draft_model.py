"""The draft model's own page pool and proposer (speculative.draft_model), for the factory: the draft is
loaded and checked there like any model, then given a pool of its own here."""

from __future__ import annotations

import logging
import math

from nvllm.config import Settings
from nvllm.engine.assembly.memory import format_bytes
from nvllm.engine.assembly.model_info import ModelInfo
from nvllm.engine.speculation.draft_proposer import DraftProposer
from nvllm.model.decoder import Model
from nvllm.model.kv_layout import KVLayout

log = logging.getLogger("nvllm.engine.assembly.factory")


def drafter(settings: Settings, model: Model, info: ModelInfo, max_len: int) -> DraftProposer:
    """The draft's pool, resident now: disable_by_batch_size sequences (the most it ever proposes for)
    of max_model_len, or of the draft's own limit when shorter."""
    blocks, length = draft_blocks(settings, info, max_len)
    # One group whatever the draft's layers: the proposer keeps one block table per sequence.
    kv = model.make_kv_cache(blocks, settings.cache.block_size, info.kv_format, layout=KVLayout.single(info.num_layers))
    model.workspace.reserve(settings.scheduler.max_num_batched_tokens)
    log.info("draft model %s (%s): a page pool of %s of %s keys and values, %d blocks; forward scratch of %s",
             info.path, info.weight_format, format_bytes(kv.nbytes), kv.format.name, blocks,
             format_bytes(model.workspace.nbytes))
    return DraftProposer(model, kv, length, settings.scheduler.max_num_batched_tokens)


def draft_blocks(settings: Settings, draft: ModelInfo, max_len: int) -> tuple[int, int]:
    """(blocks, positions per sequence) of the draft's pool."""
    length = min(max_len, draft.max_position_embeddings)
    return settings.speculative.disable_by_batch_size * math.ceil(length / settings.cache.block_size), length
