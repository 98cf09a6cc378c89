"""A model planned before anything is loaded: the model path checked, model.quantization and cache.dtype
resolved, the model's shape read from config.json or the GGUF header alone (`read_model_info`), and the page
pool sized from one memory reading (`plan_pool`; per KV format for --dry-run, or for another board).
factory.py loads and builds by these plans, and is where callers above the engine reach them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from nvllm.config import Settings
from nvllm.engine.assembly.memory import GiB, MemoryReading, PoolSizing, PoolTooSmall, size_pool
from nvllm.engine.assembly.model_info import ModelInfo
from nvllm.engine.assembly.pooling_model import (
    counting_pool,
    encoder_info,
    folder_is_encoder,
    read_encoder_config,
    settings_for,
)
from nvllm.engine.assembly.speech_model import is_speech, load_speech
from nvllm.model.config import ModelConfig, ModelLoadError, load_config
from nvllm.model.kv_layout import KVLayout
from nvllm.model.quant.kv_format import FORMATS_BY_NAME as KV_FORMATS
from nvllm.model.quant.kv_format import KVFormat
from nvllm.model.quant.kv_format import by_name as kv_format_by_name
from nvllm.model.weights.conversion import matrix_shapes, quantized_weight_bytes
from nvllm.model.weights.folder import stored_weights
from nvllm.model.weights.gguf_encoder import is_gguf_encoder, read_gguf_encoder
from nvllm.model.weights.gguf_file import open_gguf, read_gguf
from nvllm.model.weights.gguf_weights import resident_weight_bytes


class EngineBuildError(Exception):
    """The engine cannot be built from these settings; the one-line message says why and what to change."""


@dataclass(frozen=True)
class PoolPlan:
    sizing: PoolSizing
    max_model_len: int
    blocks_per_seq: int   # pages one max_model_len sequence may hold at once (ModelInfo.blocks_for)

    @property
    def full_length_seqs(self) -> int:
        """max_model_len sequences the pool holds at once."""
        return self.sizing.num_blocks // self.blocks_per_seq


def is_gguf(path: Path) -> bool:
    return path.suffix.lower() == ".gguf"


def model_path(settings: Settings) -> Path:
    """The model the settings name, a folder or a .gguf file, checked to exist (EngineBuildError otherwise)."""
    path = settings.model_path()
    if is_gguf(path) and path.is_file() or (path / "config.json").is_file() or is_speech(path):
        return path
    m = settings.model
    what = ("a file that is not a .gguf" if path.is_file() else
            "no config.json in the folder" if path.is_dir() else "nothing")
    raise EngineBuildError(
        f"{what} at {path} (model.path={m.path!r}, model.models_dir={m.models_dir!r}): give a Hugging Face "
        f"folder with config.json or a .gguf file, or pull one with `nvllm models pull NAME --dir {m.models_dir}`")


GGUF_FORMATS = "the GGUF's own formats"


def check_quantization(settings: Settings, path: Path) -> str:
    """model.quantization, refused for a GGUF (whose tensors keep their formats)."""
    kind = settings.model.quantization
    if kind and is_gguf(path):
        raise EngineBuildError(f"model.quantization={kind!r} is for Hugging Face folders: {path} is a "
                               f"GGUF, whose tensors keep the formats they are stored in")
    return kind


def folder_plan(path: Path, config: ModelConfig, kind: str) -> tuple[int, str, int]:
    """A folder's weight bytes with model.quantization `kind`, in words, and the most loading takes: the
    weights plus the largest matrix in float32, where matrices are converted as they are read."""
    if kind == "f32":
        return config.weight_bytes, "float32 (model.quantization)", config.weight_bytes
    if kind:
        held, words = quantized_weight_bytes(config, kind), f"{kind} (model.quantization)"
    else:
        held, formats = stored_weights(path, config)
        words = "stored: " + ", ".join(f"{n} {f}" for f, n in sorted(formats.items())) + " matrices"
        if held == config.weight_bytes:   # nothing converted
            return held, words, held
    return held, words, held + 4 * max(rows * cols for _, rows, cols in matrix_shapes(config))


def kv_cache_format(settings: Settings, path: Path, config: ModelConfig) -> KVFormat:
    """cache.dtype; "auto" is f16 for a GGUF (llama.cpp's default) and a folder's own float type as its
    matrices are stored (bf16 stays bf16, float32 stays float32: vLLM's rule). Checked against the head size."""
    name = settings.cache.dtype
    if name == "auto":
        if is_gguf(path):
            name = "f16"
        else:
            formats = stored_weights(path, config)[1]
            stored = max(formats, key=lambda f: formats[f]) if formats else "float32"
            name = {"BF16": "bf16", "F16": "f16"}.get(stored, "f32")
    fmt = kv_format_by_name(name)
    try:
        fmt.check_head_dim(config.head_dim)
    except ValueError as e:
        raise EngineBuildError(str(e)) from e
    return fmt


def kv_layout(settings: Settings, config: ModelConfig) -> KVLayout:
    """The pool's groups of layers: by kind of attention (model/kv_layout.py), or one with
    cache.hybrid_kv_cache off."""
    return KVLayout.of(config) if settings.cache.hybrid_kv_cache else KVLayout.single(config.num_layers)


def read_model_info(settings: Settings) -> ModelInfo:
    """The model's shapes from config.json or the GGUF header alone, nothing loaded (planning for
    another board); a folder's weight bytes are those model.quantization will leave."""
    path = model_path(settings)
    kind = check_quantization(settings, path)
    try:
        if is_speech(path):   # its config is read with its weights (mapped, not copied)
            return load_speech(settings, path, kind)[2]
        if is_gguf(path):
            f = open_gguf(path, vocabulary=False)   # the shapes: no Python object per token
            if is_gguf_encoder(f.metadata):
                e = read_gguf_encoder(open_gguf(path))
                return encoder_info(path, e.config, e.resident_bytes(), GGUF_FORMATS)
            g = read_gguf(f)
            return ModelInfo.of(path, g.config, resident_weight_bytes(g), GGUF_FORMATS,
                                kv_format=kv_cache_format(settings, path, g.config),
                                layout=kv_layout(settings, g.config))
        if folder_is_encoder(path):
            c = read_encoder_config(path)
            return encoder_info(path, c, c.weight_bytes, "float32 (planned from config.json)")
        config = load_config(path)
        return ModelInfo.of(path, config, *folder_plan(path, config, kind),
                            kv_format=kv_cache_format(settings, path, config), layout=kv_layout(settings, config))
    except (ModelLoadError, OSError, ValueError) as e:
        raise EngineBuildError(f"cannot read {path}: {e}") from e


def plan_for_board(settings: Settings, memory_gb: float) -> tuple[ModelInfo, PoolPlan]:
    """The model's size and page pool on a board with memory_gb GiB available before nvllm starts, from
    the shapes alone (`nvllm serve --dry-run --memory-gb`): what is left after the weights is the
    reading the sizing rule takes."""
    info = read_model_info(settings)
    return info, plan_pool(settings, info, board_reading(info, memory_gb))


def board_reading(info: ModelInfo, memory_gb: float) -> MemoryReading:
    """The reading a board with memory_gb GiB available before nvllm starts gives once the weights are in."""
    return MemoryReading(max(0, int(memory_gb * GiB) - info.weight_bytes),
                         f"planned: {memory_gb:g} GiB available less the weights")


def plan_per_format(settings: Settings, info: ModelInfo, reading: MemoryReading) -> dict[str, PoolPlan | str]:
    """The pool each KV format (cache.dtype's choices) would get from the one reading, or why it gets none."""
    plans: dict[str, PoolPlan | str] = {}
    for name, fmt in KV_FORMATS.items():
        try:
            fmt.check_head_dim(info.head_dim)
            plans[name] = plan_pool(settings, info, reading, fmt)
        except (EngineBuildError, ValueError) as e:
            plans[name] = str(e)
    return plans


def max_model_len(settings: Settings, info: ModelInfo) -> int:
    """scheduler.max_model_len, never past the model's own limit."""
    limit = info.max_position_embeddings
    return min(settings.scheduler.max_model_len or limit, limit)


def plan_pool(settings: Settings, info: ModelInfo, reading: MemoryReading, fmt: KVFormat | None = None) -> PoolPlan:
    """The page pool from one memory reading, taken after the weights are loaded, for keys and values in
    fmt (None: the model's, cache.dtype; --dry-run plans each); cache.num_blocks overrides the sizing.
    Raises EngineBuildError when one max_model_len sequence would not fit."""
    settings = settings_for(settings, info)
    cache = settings.cache
    max_len = max_model_len(settings, info)
    chunk = settings.scheduler.max_num_batched_tokens
    per_seq = info.blocks_for(max_len, cache.block_size, chunk)
    if info.bytes_per_token == 0:   # an encoder's pages hold nothing: as many as its sequences may count
        return PoolPlan(counting_pool(settings, reading, per_seq), max_len, per_seq)
    try:
        per_token = info.bytes_per_token if fmt is None else info.kv_bytes_per_token(fmt)
        beside = info.draft_pool_bytes + info.cross_bytes
        sizing = size_pool(per_token * cache.block_size, max(0, reading.available_bytes - beside),
                           cache.memory_fraction, cache.reserve_mb << 20, cache.max_pool_mb << 20,
                           cache.num_blocks, per_seq, block_size=cache.block_size,
                           source=reading.source + (" less the draft's pool" if info.draft_pool_bytes else "")
                           + (" less the seats' cross-attention" if info.cross_bytes else ""),
                           max_model_len=max_len, max_num_seqs=settings.scheduler.max_num_seqs,
                           held_blocks=info.pinned_blocks,
                           longest=lambda n: info.longest_in(n, cache.block_size, chunk))
    except PoolTooSmall as e:
        raise EngineBuildError(f"page pool too small: {e}") from e
    return PoolPlan(sizing, max_len, per_seq)
