"""The one way to build an engine: a model path and one Settings in, a ready LLMEngine out.

The daemon, `LLM`, `nvllm generate` and `nvllm bench` all come through here, so the model, the
tokenizer, the generation defaults, the EOS ids, the max_model_len clamp and the page pool's size are
worked out once, by one rule. The steps are separate functions because the daemon logs between them
and `nvllm serve --dry-run` stops before allocating anything:

    loaded = load_model(settings)                          # weights, tokenizer, defaults, EOS ids
    plan = plan_pool(settings, loaded.info, reading)       # pages from one memory reading
    engine = create_engine(settings, loaded, plan)         # maps the pool, backs one sequence's pages
                                                           # now and the rest in the background

`build_engine(settings)` does all three with the memory available now.

The plan (the model's shape read before loading, the pool sized) is planning.py's; it is reached here.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nvllm.config import Settings

# the plan, for the callers above the engine, which reach the assembly through this module alone
from nvllm.engine.assembly.describe import ModelDescription as ModelDescription
from nvllm.engine.assembly.describe import describe_model as describe_model
from nvllm.engine.assembly.describe import human_count as human_count
from nvllm.engine.assembly.draft_model import draft_blocks, drafter
from nvllm.engine.assembly.footprint import Footprint, measured, resident_bytes
from nvllm.engine.assembly.memory import MemoryReading, available_memory, format_bytes, give_back_memory
from nvllm.engine.assembly.model_info import ModelInfo
from nvllm.engine.assembly.planning import (
    GGUF_FORMATS,
    EngineBuildError,
    PoolPlan,
    check_quantization,
    folder_plan,
    is_gguf,
    kv_cache_format,
    kv_layout,
    max_model_len,
    model_path,
    plan_pool,
)
from nvllm.engine.assembly.planning import KV_FORMATS as KV_FORMATS
from nvllm.engine.assembly.planning import board_reading as board_reading
from nvllm.engine.assembly.planning import plan_for_board as plan_for_board
from nvllm.engine.assembly.planning import plan_per_format as plan_per_format
from nvllm.engine.assembly.planning import read_model_info as read_model_info
from nvllm.engine.assembly.pool_backing import CHUNK_BYTES, PoolBacking
from nvllm.engine.assembly.pooling_model import (
    check_settings,
    encoder_info,
    folder_is_encoder,
    load_encoder_folder,
    load_encoder_gguf,
    set_decoder_task,
    settings_for,
)
from nvllm.engine.assembly.speech_model import is_speech, load_speech
from nvllm.engine.llm_engine import LLMEngine
from nvllm.engine.speculation.speculator import Speculator
from nvllm.engine.structured.compiler import StructuredCompiler
from nvllm.engine.structured.thinking import think_token_ids
from nvllm.engine.warm.pinned_prompts import PinnedPrompt, PinnedPromptError, read_pinned_prompts
from nvllm.engine.warm.prefix_store import model_identity
from nvllm.engine.warm.warmup import Warmup
from nvllm.model.config import ModelLoadError, read_json
from nvllm.model.decoder import Model
from nvllm.model.encoder import Encoder
from nvllm.model.kernels import ops, threads
from nvllm.model.kv_cache import KVCache
from nvllm.model.weights.gguf_encoder import is_gguf_encoder
from nvllm.model.weights.gguf_file import GGUFFile, open_gguf, read_gguf
from nvllm.model.weights.gguf_weights import load_gguf_weights
from nvllm.text.tokenizer import Tokenizer

log = logging.getLogger("nvllm.engine.assembly.factory")


@dataclass
class LoadedModel:
    model: Model | Encoder
    tokenizer: Tokenizer
    generation_defaults: dict[str, Any]
    eos_token_ids: frozenset[int]
    info: ModelInfo
    load_s: float
    pinned: list[PinnedPrompt] = field(default_factory=list)   # cache.pinned_prompts, tokenized
    draft: LoadedModel | None = None   # speculative.draft_model, checked to share the tokenizer
    footprint: Footprint | None = None   # what the load held besides the weights (a decoder's; footprint.py)


def load_model(settings: Settings) -> LoadedModel:
    """Weights, tokenizer, generation defaults and the EOS ids, merged here and nowhere else."""
    path = model_path(settings)
    kind = check_quantization(settings, path)
    t0 = time.monotonic()
    before = resident_bytes()
    try:
        if is_speech(path):
            whisper, tokenizer, info = load_speech(settings, path, kind)
            return LoadedModel(whisper, tokenizer, {}, frozenset(), info, time.monotonic() - t0)
        pooling_type, f = None, open_gguf(path) if is_gguf(path) else None
        if f is not None and is_gguf_encoder(f.metadata) or f is None and folder_is_encoder(path):
            encoder, tokenizer = load_encoder_gguf(f) if f is not None else load_encoder_folder(path, kind)
            info = encoder_info(path, encoder.config, encoder.weights.nbytes, GGUF_FORMATS if f is not None
                                else f"{kind} (model.quantization)" if kind else "stored")
            check_settings(settings, info)
            return LoadedModel(encoder, tokenizer, {}, frozenset(), info, time.monotonic() - t0)
        if f is not None:
            model, tokenizer, defaults, pooling_type, tokenizer_bytes = _load_gguf(f)
        else:
            model = Model.from_dir(path, kind)
            tokenizer, tokenizer_bytes = measured(lambda: Tokenizer.from_dir(path))
            gen_file = path / "generation_config.json"
            defaults = read_json(gen_file) if gen_file.exists() else {}
        set_decoder_task(settings, path, model, tokenizer, pooling_type)   # an embedder or reranker, or not
    except (ModelLoadError, OSError, ValueError) as e:
        raise EngineBuildError(f"cannot load the model at {path}: {e}") from e
    c = model.config
    # The tokenizer's own EOS (and EOT) and every id config.json and generation_config.json name:
    # each ends a reply.
    eos = set(c.eos_token_ids) | set(_ids(defaults.get("eos_token_id"))) | set(tokenizer.extra_eos_ids)
    if tokenizer.eos_token_id is not None:
        eos.add(tokenizer.eos_token_id)
    kv = kv_cache_format(settings, path, c)
    model.kv_layout = kv_layout(settings, c)
    if is_gguf(path):
        info = ModelInfo.of(path, c, model.weights.nbytes, GGUF_FORMATS, kv_format=kv, layout=model.kv_layout)
    else:
        _, words, peak = folder_plan(path, c, kind)
        info = ModelInfo.of(path, c, model.weights.nbytes, words, peak, kv, layout=model.kv_layout)
    if model.task != "generate":
        info = dataclasses.replace(info, task=model.task)
        try:
            check_settings(settings, info)
        except ValueError as e:
            raise EngineBuildError(f"cannot serve {path}: {e}") from None
    try:
        pinned = read_pinned_prompts(settings.cache.pinned_prompts, tokenizer, c.vocab_size,
                                     max_model_len(settings, info), settings.cache.block_size)
    except PinnedPromptError as e:
        raise EngineBuildError(str(e)) from None
    info = dataclasses.replace(info, pinned_blocks=sum(len(p.token_ids) for p in pinned) // settings.cache.block_size
                               * info.kv_groups)
    give_back_memory()   # the tokenizer's parse and the packing's chunks, freed but kept by glibc until trimmed
    loaded = LoadedModel(model, tokenizer, defaults, frozenset(eos), info, time.monotonic() - t0, pinned,
                         footprint=Footprint(before, tokenizer_bytes, info.weight_bytes, resident_bytes()))
    if settings.speculative.method == "draft":
        loaded.draft = draft = _load_draft(settings, loaded)
        blocks, _ = draft_blocks(settings, draft.info, max_model_len(settings, info))
        loaded.info = dataclasses.replace(
            info, draft_pool_bytes=blocks * settings.cache.block_size
            * draft.info.kv_bytes_per_token(draft.info.kv_format, draft.info.num_layers))
    return loaded


def _load_draft(settings: Settings, target: LoadedModel) -> LoadedModel:
    """speculative.draft_model, loaded as a model of its own (its file's formats, no pinned prompts) and
    refused unless its vocabulary is the target's, token for token: its proposals are token ids."""
    where = f"speculative.draft_model={settings.speculative.draft_model!r}"
    own = dataclasses.replace(settings, model=dataclasses.replace(
        settings.model, path=settings.speculative.draft_model, quantization=""),
        cache=dataclasses.replace(settings.cache, pinned_prompts=[], persist_dir=""),
        speculative=dataclasses.replace(settings.speculative, method="none"))
    path = own.model_path()
    if not (is_gguf(path) and path.is_file() or (path / "config.json").is_file()):
        raise EngineBuildError(f"{where}: no model at {path}: give a Hugging Face folder with config.json "
                               f"or a .gguf file sharing the target's tokenizer")
    try:
        draft = load_model(own)
    except EngineBuildError as e:
        raise EngineBuildError(f"{where}: {e}") from e
    if not isinstance(draft.model, Model):
        raise EngineBuildError(f"{where}: {draft.info.architecture} does not generate text; a draft model must")
    why = _tokenizer_difference(target, draft)
    if why:
        raise EngineBuildError(f"{where} cannot draft for {target.info.path}: {why}; a draft model must "
                               f"share the target's tokenizer")
    return draft


def _tokenizer_difference(target: LoadedModel, draft: LoadedModel) -> str:
    """Why draft's token ids do not mean target's ("" when they do): the models' vocabulary sizes and
    every token string with its id (a dict compare, milliseconds for 150k tokens)."""
    a, b = target.model.config.vocab_size, draft.model.config.vocab_size
    if a != b:
        return f"its vocabulary has {b} tokens, the target's {a}"
    return draft.tokenizer.difference(target.tokenizer)


def _load_gguf(f: GGUFFile) -> tuple[Model, Tokenizer, dict[str, Any], int | None, int]:
    """A GGUF holds weights, tokenizer and template in one file, and no sampling defaults; and the pooling
    llama.cpp's converter writes for an embedder (`<arch>.pooling_type`); and what the tokenizer's build added
    to the resident set."""
    g = read_gguf(f)
    # The vocabulary's lists (30 MiB of Python objects for 150k tokens) are the tokenizer's once it is built:
    # not held while the weights load, and not counted as its own.
    big = [k for k, v in g.metadata.items() if k.startswith("tokenizer.ggml.") and isinstance(v, list)]
    tokenizer, grown = measured(lambda: Tokenizer.from_gguf_metadata(g.metadata, str(f.path)))
    for key in big:
        del g.metadata[key]
    pooling = g.metadata.get(f"{g.metadata.get('general.architecture')}.pooling_type")
    return (Model(g.config, load_gguf_weights(g)), tokenizer, {}, pooling if isinstance(pooling, int) else None,
            grown)


def _ids(value: Any) -> list[int]:
    """eos_token_id in config.json / generation_config.json: an int, a list of ints, or null."""
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, (list, tuple)):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def create_engine(settings: Settings, loaded: LoadedModel, plan: PoolPlan,
                  back: Callable[[KVCache, int, int], None] = KVCache.back_blocks,
                  eager_bytes: int = CHUNK_BYTES) -> LLMEngine:
    """Map the pool and back the blocks of one max_model_len sequence (and at least its first
    eager_bytes) now, the rest on a thread of its own (engine/assembly/pool_backing.py) whose blocks the
    engine hands out only once backed; then the engine.

    back(kv, start, stop) backs blocks [start, stop) in the background (KVCache.back_blocks; tests slow
    it or make it fail, with eager_bytes 0).
    """
    t0 = time.monotonic()
    settings = settings_for(settings, loaded.info)
    sz = plan.sizing
    # One max_model_len sequence and the pinned prompts' pages, which are held for good; and a first chunk
    # however small those are: it takes milliseconds, and a small pool is then whole from the start rather
    # than behind a thread at nice 10, which a busy machine may hold off for seconds.
    one_sequence = loaded.info.pinned_blocks + loaded.info.blocks_for(
        plan.max_model_len, sz.block_size, settings.scheduler.max_num_batched_tokens)
    first = min(sz.num_blocks, max(one_sequence, eager_bytes // max(1, sz.bytes_per_block)))
    kv = loaded.model.make_kv_cache(sz.num_blocks, settings.cache.block_size, loaded.info.kv_format,
                                    resident_blocks=first)
    backing = None
    if first < sz.num_blocks:
        backing = PoolBacking(lambda start, stop: back(kv, start, stop), first, sz.num_blocks,
                              sz.bytes_per_block).start()
    log.info("page pool of %s of %s keys and values mapped in %.2f s (%s): %d of %d blocks (%s, one "
             "max_model_len sequence or the first chunk) resident now%s", format_bytes(kv.nbytes), kv.format.name,
             time.monotonic() - t0, kv.populated_by, first, sz.num_blocks, format_bytes(first * sz.bytes_per_block),
             ", the rest backed in the background" if backing is not None else "")
    # A step's activations, made once for the most tokens a step takes (model/workspace.py): with the page
    # pool and the weights, what the daemon holds whatever its prompts.
    budget = settings.scheduler.max_num_batched_tokens
    if isinstance(loaded.model, Model):
        loaded.model.workspace.reserve(budget)
        log.info("forward scratch of %s for steps of up to %d tokens", format_bytes(loaded.model.workspace.nbytes),
                 budget)
        loaded.model.set_context(plan.max_model_len)   # longrope's factors follow the longest sequence served
    speculator = Speculator(settings.speculative, plan.max_model_len)
    if loaded.draft is not None:
        assert isinstance(loaded.draft.model, Model)   # _load_draft refuses an encoder
        loaded.draft.model.set_context(plan.max_model_len)
        speculator.drafter = drafter(settings, loaded.draft.model, loaded.draft.info, plan.max_model_len)
    structured = StructuredCompiler(loaded.tokenizer, loaded.model.config.vocab_size, loaded.eos_token_ids)
    # With a reasoning parser, a constrained answer's grammar waits for the end of its thinking.
    think = think_token_ids(loaded.tokenizer) if settings.server.reasoning_parser else None
    engine = LLMEngine(loaded.model, loaded.tokenizer, kv, settings, plan.max_model_len, speculator, structured,
                       loaded.generation_defaults, loaded.eos_token_ids, backing, think)
    cache = settings.cache
    if loaded.pinned or cache.persist_dir:
        ident = identity(settings, loaded.info)
        # keys turned by longrope's long factors: a file of the short ones must not match
        if isinstance(loaded.model, Model) and loaded.model.long_rope:
            ident = {**ident, "long_rope": True}
        engine.warmup = Warmup(engine, loaded.pinned, cache.persist_dir, cache.persist_max_mb << 20,
                               ident, loaded.info.vocab_size)
    return engine


def identity(settings: Settings, info: ModelInfo) -> dict[str, Any]:
    """What the persisted prefix cache must match: the model's files, its shape, how its weights are
    held and multiplied (engine/warm/prefix_store.py)."""
    m = settings.model
    return model_identity(info.path, {
        "architecture": info.architecture, "num_layers": info.num_layers, "hidden_size": info.hidden_size,
        "vocab_size": info.vocab_size, "num_kv_heads": info.num_kv_heads, "head_dim": info.head_dim,
        "weight_format": info.weight_format, "quantization": m.quantization, "activations": m.activations})


def build_engine(settings: Settings,
                 memory_reader: Callable[[], MemoryReading] = available_memory) -> LLMEngine:
    loaded = load_model(settings)
    return create_engine(settings, loaded, plan_pool(settings, loaded.info, memory_reader()))


def compute_description() -> str:
    """Which compute path runs: the C kernels, or the NumPy twins and why."""
    return ops.describe()


def threads_description(n: int, setting: int) -> str:
    """How many matmul threads compute (an engine's `threads`, for model.threads = setting) and why."""
    return threads.describe(n, setting)
