"""A whisper.cpp ggml .bin file -> its tensors under Hugging Face's names, a WhisperConfig and the tokenizer.

The layout (whisper.cpp's models/convert-pt-to-ggml.py writes it, src/whisper.cpp's whisper_model_load reads
it; little-endian, nothing aligned): the magic 0x67676d6c; eleven int32 hyperparameters (n_vocab, n_audio_ctx,
n_audio_state, n_audio_head, n_audio_layer, n_text_ctx, n_text_state, n_text_head, n_text_layer, n_mels,
ftype, whose thousands are the quantization version); the mel filters (int32 n_mel, int32 n_fft, then as many
float32, unused here: audio/features.py computes Hugging Face's own); the vocabulary (int32 count, then each
token's uint32 length and bytes); then tensors to the end of the file, each int32 n_dims, name length and
type (ggml's type ids, GGUF's: F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, ...), n_dims int32 sizes innermost
first, the name, the data. Every count, length and size is checked against the bytes the file holds before
anything is made from it; a hostile or broken file is one ModelLoadError line naming the file and the reason.
The tensors are views of the mapping: F16 and the block formats reach the kernels as they are (mapped_tensors).

The tokenizer is rebuilt from the vocabulary's bytes with the merges their ranks imply (text/whisper_vocab.py,
which says why this encodes as Hugging Face's does), its special tokens placed by n_vocab as whisper.cpp
places them; the suppress tables are openai-whisper's, computed from that tokenizer.
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nvllm.model.config import ModelLoadError
from nvllm.model.quant.formats import UnsupportedTensorType, block_format, raw_nbytes
from nvllm.model.weights.bounded_reader import BoundedReader, read_mapped
from nvllm.model.weights.ct2_file import Tensor
from nvllm.model.weights.mapped_tensors import FileTensors, MappedTensors, file_reader
from nvllm.model.weights.whisper_hf_config import (
    WhisperDims,
    begin_suppress,
    default_alignment_heads,
    whisper_config,
)
from nvllm.model.whisper_config import WhisperConfig
from nvllm.text.tokenizer import Tokenizer
from nvllm.text.whisper_vocab import suppress_tokens, tokenizer_from_bytes, whisper_specials

MAGIC = 0x67676D6C
HPARAMS = ("n_vocab", "n_audio_ctx", "n_audio_state", "n_audio_head", "n_audio_layer", "n_text_ctx",
           "n_text_state", "n_text_head", "n_text_layer", "n_mels", "ftype")
QNT_VERSION_FACTOR = 1000   # ftype // 1000: the version of the block layouts (ggml's GGML_QNT_VERSION)
QNT_VERSION = 2             # the layouts GGUF keeps; version 1 (ggml before May 2023) differs in its scales
MAX_HPARAM = 1 << 20
MAX_FILTER_VALUES = 1 << 20  # 80 x 201 and 128 x 201 in real files
MAX_TOKEN_BYTES = 1024       # Whisper's longest token is 128 bytes
MAX_DIMS = 4
MAX_NAME_BYTES = 256
MAX_TENSORS = 1 << 14        # large-v3 has 1273
_TENSOR_HEADER = 12
# whisper.cpp's (openai-whisper's) names inside a block -> Hugging Face's
_BLOCK_NAMES = {"attn.query": "self_attn.q_proj", "attn.key": "self_attn.k_proj", "attn.value": "self_attn.v_proj",
                "attn.out": "self_attn.out_proj", "attn_ln": "self_attn_layer_norm",
                "cross_attn.query": "encoder_attn.q_proj", "cross_attn.key": "encoder_attn.k_proj",
                "cross_attn.value": "encoder_attn.v_proj", "cross_attn.out": "encoder_attn.out_proj",
                "cross_attn_ln": "encoder_attn_layer_norm", "mlp.0": "fc1", "mlp.2": "fc2",
                "mlp_ln": "final_layer_norm"}


@dataclass
class GGMLWhisper:
    """A checked file: its hyperparameters, vocabulary (bytes, in id order) and tensors by whisper.cpp's name."""
    path: Path
    hparams: dict[str, int]
    vocab: list[bytes]
    tensors: dict[str, Tensor]
    mapping: mmap.mmap

    @property
    def quantization_version(self) -> int:
        return self.hparams["ftype"] // QNT_VERSION_FACTOR


class _Reader(BoundedReader):
    """ggml's fields: little-endian int32s and counts within bounds."""

    def int32(self, what: str) -> int:
        return int.from_bytes(self.take(4, what), "little", signed=True)

    def count(self, what: str, low: int, high: int) -> int:
        n = self.int32(what)
        if not low <= n <= high:
            raise self.fail(f"{what} is {n} (expected {low} to {high})")
        return n


def open_ggml_whisper(path: str | Path) -> GGMLWhisper:
    """Map the file and check all of it: header, filters, vocabulary, and every tensor's type, dimensions,
    name and bytes; the tensors are views of the mapping."""
    return read_mapped(Path(path), 4 + 4 * len(HPARAMS), "a whisper.cpp model", _Reader, _read)


def _read(r: _Reader, mm: mmap.mmap) -> GGMLWhisper:
    magic = int.from_bytes(r.take(4, "the magic"), "little")
    if magic != MAGIC:
        raise r.fail(f"not a whisper.cpp model (magic {magic:#010x}, expected {MAGIC:#010x})")
    hp = {name: r.count(f"hyperparameter {name}", 0 if name == "ftype" else 1, MAX_HPARAM) for name in HPARAMS}
    if hp["n_text_state"] != hp["n_audio_state"]:
        raise r.fail(f"n_text_state {hp['n_text_state']} differs from n_audio_state {hp['n_audio_state']}")
    n_mel = r.count("the mel filters' n_mel", 0, MAX_FILTER_VALUES)
    n_fft = r.count("the mel filters' n_fft", 0, MAX_FILTER_VALUES)
    if n_mel * n_fft > MAX_FILTER_VALUES:
        raise r.fail(f"mel filters of {n_mel} x {n_fft} (at most {MAX_FILTER_VALUES} values)")
    r.take(4 * n_mel * n_fft, "the mel filters")
    n_tokens = r.count("the vocabulary's token count", 0, hp["n_vocab"])
    if n_tokens > r.left() // 4:
        raise r.fail(f"the vocabulary claims {n_tokens} tokens, more than the {r.left()} bytes left can hold "
                     "(truncated or corrupt)")
    vocab = _tokens(r, n_tokens)
    tensors: dict[str, Tensor] = {}
    while r.left():
        if len(tensors) == MAX_TENSORS:
            raise r.fail(f"holds more than {MAX_TENSORS} tensors (a Whisper model has at most 1273)")
        name, t = _tensor(r, mm)
        if name in tensors:
            raise r.fail(f"tensor {name!r} appears twice")
        tensors[name] = t
    return GGMLWhisper(r.path, hp, vocab, tensors, mm)


def _tokens(r: _Reader, count: int) -> list[bytes]:
    """The vocabulary's tokens, each a uint32 length and its bytes (read inline: 50k tokens per file)."""
    buf, pos, end, out = r.buf, r.pos, len(r.buf), []
    for i in range(count):
        if pos + 4 > end:
            r.pos = pos
            r.take(4, f"the length of token {i}")
        n = struct.unpack_from("<I", buf, pos)[0]
        if n > MAX_TOKEN_BYTES:
            raise r.fail(f"token {i} is {n} bytes long (at most {MAX_TOKEN_BYTES})")
        if pos + 4 + n > end:
            r.pos = pos + 4
            r.take(n, f"token {i}")
        out.append(bytes(buf[pos + 4:pos + 4 + n]))
        pos += 4 + n
    r.pos = pos
    return out


def _tensor(r: _Reader, mm: mmap.mmap) -> tuple[str, Tensor]:
    at = r.pos
    n_dims = r.count(f"the dimension count of the tensor at offset {at}", 1, MAX_DIMS)
    n_name = r.count(f"the name length of the tensor at offset {at}", 1, MAX_NAME_BYTES)
    ttype = r.int32(f"the type of the tensor at offset {at}")
    ne = [r.count(f"the dimensions of the tensor at offset {at}", 1, 1 << 30) for _ in range(n_dims)]
    try:
        name = bytes(r.take(n_name, f"the name of the tensor at offset {at}")).decode("utf-8")
    except UnicodeDecodeError:
        raise r.fail(f"the name of the tensor at offset {at} is not valid UTF-8") from None
    shape = tuple(reversed(ne))
    try:
        fmt = block_format(ttype, name)
        nbytes = raw_nbytes(fmt, shape)
    except UnsupportedTensorType as e:
        raise r.fail(str(e)) from None
    except ValueError as e:   # a row that is not a whole number of blocks
        raise r.fail(f"tensor {name!r}: {e}") from None
    start = r.pos
    r.take(nbytes, f"the data of tensor {name!r} ({fmt.name} {list(shape)})")
    return name, (fmt, np.frombuffer(mm, np.uint8, count=nbytes, offset=start), shape)


# what the hyperparameters may be before anything is sized by them (WhisperConfig.from_hf bounds them again)
_BOUNDS = {"n_audio_layer": 128, "n_text_layer": 128, "n_audio_head": 256, "n_text_head": 256,
           "n_audio_state": 8192, "n_audio_ctx": 1 << 16, "n_text_ctx": 1 << 16, "n_mels": 256}


def dims_of(g: GGMLWhisper) -> WhisperDims:
    """The sizes the hyperparameters give, each bounded."""
    hp = g.hparams
    for name, top in _BOUNDS.items():
        if hp[name] > top:
            raise ModelLoadError(f"{g.path}: hyperparameter {name} is {hp[name]} (at most {top})")
    d = hp["n_audio_state"]
    return WhisperDims(
        vocab_size=hp["n_vocab"], num_mel_bins=hp["n_mels"], d_model=d, encoder_layers=hp["n_audio_layer"],
        encoder_attention_heads=hp["n_audio_head"], decoder_layers=hp["n_text_layer"],
        decoder_attention_heads=hp["n_text_head"], encoder_ffn_dim=4 * d, decoder_ffn_dim=4 * d,
        max_source_positions=hp["n_audio_ctx"], max_target_positions=hp["n_text_ctx"])


def expected_tensors(dims: WhisperDims) -> dict[str, tuple[str, tuple[int, ...]]]:
    """whisper.cpp's name -> (Hugging Face's name, shape) of every tensor a model of `dims` holds."""
    d, ffn = dims.d_model, dims.encoder_ffn_dim
    e, dec = "model.encoder.", "model.decoder."
    out = {"encoder.positional_embedding": (e + "embed_positions.weight", (dims.max_source_positions, d)),
           "encoder.conv1.weight": (e + "conv1.weight", (d, dims.num_mel_bins, 3)),
           "encoder.conv1.bias": (e + "conv1.bias", (d, 1)),
           "encoder.conv2.weight": (e + "conv2.weight", (d, d, 3)), "encoder.conv2.bias": (e + "conv2.bias", (d, 1)),
           "encoder.ln_post.weight": (e + "layer_norm.weight", (d,)),
           "encoder.ln_post.bias": (e + "layer_norm.bias", (d,)),
           "decoder.positional_embedding": (dec + "embed_positions.weight", (dims.max_target_positions, d)),
           "decoder.token_embedding.weight": (dec + "embed_tokens.weight", (dims.vocab_size, d)),
           "decoder.ln.weight": (dec + "layer_norm.weight", (d,)), "decoder.ln.bias": (dec + "layer_norm.bias", (d,))}
    for side, n_layers, hf in (("encoder", dims.encoder_layers, e), ("decoder", dims.decoder_layers, dec)):
        for n in range(n_layers):
            for part, hf_part in _BLOCK_NAMES.items():
                if side == "encoder" and part.startswith("cross_attn"):
                    continue
                rows, cols = {"mlp.0": (ffn, d), "mlp.2": (d, ffn)}.get(part, (d, d))
                src, dst = f"{side}.blocks.{n}.{part}", f"{hf}layers.{n}.{hf_part}"
                if part.endswith("_ln"):
                    out[src + ".weight"], out[src + ".bias"] = (dst + ".weight", (d,)), (dst + ".bias", (d,))
                    continue
                out[src + ".weight"] = (dst + ".weight", (rows, cols))
                if not part.endswith(".key"):
                    out[src + ".bias"] = (dst + ".bias", (rows,))
    return out


def hf_tensors(g: GGMLWhisper, dims: WhisperDims) -> dict[str, Tensor]:
    """The file's tensors by Hugging Face name, each checked to be the one whisper.cpp expects: none missing,
    none unknown, every shape as the hyperparameters say (conv biases [d, 1] read as [d])."""
    expected = expected_tensors(dims)
    if not g.tensors:
        raise ModelLoadError(f"{g.path}: the file holds no tensors (a header and vocabulary only, as whisper.cpp's "
                             "for-tests files)")
    unknown = sorted(set(g.tensors) - set(expected))
    if unknown:
        raise ModelLoadError(f"{g.path}: unknown tensor {unknown[0]!r} (whisper.cpp refuses it too)")
    out = {}
    for name, (hf_name, shape) in expected.items():
        if name not in g.tensors:
            raise ModelLoadError(f"{g.path}: tensor {name!r} is missing")
        fmt, raw, got = g.tensors[name]
        if got != shape:
            raise ModelLoadError(f"{g.path}: tensor {name!r} has shape {list(got)}, expected {list(shape)}")
        if fmt.block_elems > 1 and g.quantization_version != QNT_VERSION:
            raise ModelLoadError(f"{g.path}: tensor {name!r} is {fmt.name} in ggml's block layout version "
                                 f"{g.quantization_version} (ftype {g.hparams['ftype']}); nvllm reads version "
                                 f"{QNT_VERSION}, whisper.cpp's since May 2023: quantize the model again")
        out[hf_name] = (fmt, raw, shape[:1] if len(shape) == 2 and shape[1] == 1 and "conv" in name else shape)
    return out


def read_ggml_whisper(path: Path, quantization: str = "") -> tuple[FileTensors, WhisperConfig, Tokenizer]:
    """A whisper.cpp file's tensors by Hugging Face name (a TensorReader: F16 and the block formats kept as
    the file has them, packed where the kernels read them, or converted for `quantization`, model.quantization),
    its WhisperConfig and its tokenizer. ModelLoadError naming the file and the reason for anything else."""
    g = open_ggml_whisper(path)
    try:
        dims = dims_of(g)
        try:
            specials = whisper_specials(dims.vocab_size)
        except ValueError as e:
            raise ModelLoadError(f"{g.path}: {e}") from None
        tensors = hf_tensors(g, dims)    # before the tokenizer: the cheap checks first
        try:
            tokenizer = tokenizer_from_bytes(g.vocab, dims.vocab_size, str(g.path))
        except ValueError as e:
            raise ModelLoadError(f"{g.path}: {e}") from None
        config = whisper_config(dims, specials, suppress_tokens(tokenizer, specials),
                                begin_suppress(tokenizer, specials), default_alignment_heads(dims), str(g.path))
    except BaseException:
        g.tensors = {}
        try:
            g.mapping.close()
        except BufferError:
            pass
        raise
    file = MappedTensors(g.path, tensors, g.mapping)
    return file_reader(file, {name: name for name in tensors}, quantization), config, tokenizer

