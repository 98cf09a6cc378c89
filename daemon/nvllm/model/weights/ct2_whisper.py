"""A CTranslate2 Whisper folder (faster-whisper's: model.bin, config.json, tokenizer.json or vocabulary.txt)
-> its tensors under Hugging Face's names, a WhisperConfig and the tokenizer.

CTranslate2's converter renames and fuses Hugging Face's tensors; here they are named back. Each attention's
q|k|v is one matrix (linear_0) with one bias whose k third is zeros (Whisper's k has no bias, and a k bias
never changes attention: it adds one number to every score of a query), the cross-attention's k|v one matrix
(linear_1); they are split back into views of their rows, nothing copied. The output projection is an alias
of the token embeddings (tied, as in Hugging Face's model). The sizes come from the tensors' shapes and the
spec's head counts; the suppress tables, the languages and the alignment heads from config.json.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer as _Backend

from nvllm.model.config import ModelLoadError
from nvllm.model.weights.ct2_file import CT2File, Tensor, open_ct2
from nvllm.model.weights.mapped_tensors import FileTensors, MappedTensors, file_reader
from nvllm.model.weights.whisper_hf_config import (
    WhisperDims,
    begin_suppress,
    default_alignment_heads,
    whisper_config,
)
from nvllm.model.whisper_config import WhisperConfig
from nvllm.text.tokenizer import Tokenizer
from nvllm.text.whisper_vocab import (
    BYTE_CHARS,
    add_whisper_specials,
    specials_from_tokenizer,
    suppress_tokens,
    tokenizer_from_bytes,
    whisper_specials,
    whisper_tokenizer,
)

SPEC = "WhisperSpec"
LATEST_REVISION = 3
GELU = 3                       # CTranslate2's Activation enum: RELU, GELUTanh, SWISH, GELU, ...
# spec flags a Whisper decoder has; anything else is another model under Whisper's name
_DECODER_FLAGS = {"decoder/activation": GELU, "decoder/pre_norm": 1, "decoder/scale_embeddings": 0,
                  "decoder/alibi": 0, "decoder/start_from_zero_embedding": 0}


def read_ct2_whisper(folder: Path, quantization: str = "") -> tuple[FileTensors, WhisperConfig, Tokenizer]:
    """A CTranslate2 Whisper folder's tensors by Hugging Face name (a TensorReader: matrices in the file's
    storage, packed where the kernels read it, or converted for `quantization`, model.quantization), its
    WhisperConfig and its tokenizer. ModelLoadError naming the file and the reason for anything else."""
    folder = Path(folder)
    f = open_ct2(folder / "model.bin")
    try:
        if f.binary_version >= 2 and f.spec != SPEC:
            raise f.fail(f"spec {f.spec!r} is not Whisper's ({SPEC!r})")
        if f.revision > LATEST_REVISION:
            raise f.fail(f"{SPEC} revision {f.revision} is newer than nvllm reads ({LATEST_REVISION})")
        for name, want in _DECODER_FLAGS.items():
            if name in f and f.scalar(name) != want:
                raise f.fail(f"{name} is {f.scalar(name)}, Whisper's is {want}")
        dims = ct2_dims(f)
        tensors = hf_tensors(f, dims)
        tokenizer = _tokenizer(folder, dims.vocab_size)
        config = _config(folder, dims, tokenizer)
    except BaseException:
        f.close()
        raise
    file = MappedTensors(f.path, tensors, f.mapping)
    return file_reader(file, {name: name for name in tensors}, quantization), config, tokenizer


def _layers(f: CT2File, side: str) -> int:
    """How many layer_N scopes `side` ("encoder", "decoder") has, numbered from 0 without a gap."""
    found = set()
    for name in f.variables:
        parts = name.split("/")
        if parts[0] == side and len(parts) > 2 and parts[1].startswith("layer_") and parts[1][6:].isdigit():
            found.add(int(parts[1][6:]))
    n = len(found)
    if found != set(range(n)):
        raise f.fail(f"the {side}'s layers are numbered {sorted(found)[:8]}..., not 0 to {n - 1}")
    return n


def _shape(f: CT2File, name: str, rank: int) -> tuple[int, ...]:
    shape = f.variable(name).shape
    if len(shape) != rank:
        raise f.fail(f"variable {name!r} has shape {list(shape)}, expected {rank} dimensions")
    return shape


def _heads(f: CT2File, name: str) -> int:
    value = f.scalar(name)
    if not isinstance(value, int) or value < 1:
        raise f.fail(f"{name} is {value!r}, not a head count")
    return value


def ct2_dims(f: CT2File) -> WhisperDims:
    """The sizes, from the tensors' shapes and the spec's head counts (WhisperConfig.from_hf bounds them)."""
    vocab, d = _shape(f, "decoder/embeddings/weight", 2)
    enc, dec = _layers(f, "encoder"), _layers(f, "decoder")
    if enc == 0 or dec == 0:
        raise f.fail(f"{enc} encoder and {dec} decoder layers")
    return WhisperDims(
        vocab_size=vocab, num_mel_bins=_shape(f, "encoder/conv1/weight", 3)[1], d_model=d,
        encoder_layers=enc, encoder_attention_heads=_heads(f, "encoder/num_heads"),
        decoder_layers=dec, decoder_attention_heads=_heads(f, "decoder/num_heads"),
        encoder_ffn_dim=_shape(f, "encoder/layer_0/ffn/linear_0/weight", 2)[0],
        decoder_ffn_dim=_shape(f, "decoder/layer_0/ffn/linear_0/weight", 2)[0],
        max_source_positions=_shape(f, "encoder/position_encodings/encodings", 2)[0],
        max_target_positions=_shape(f, "decoder/position_encodings/encodings", 2)[0])


def _rows(f: CT2File, t: Tensor, r0: int, r1: int, name: str) -> Tensor:
    """Rows r0:r1 of a tensor, a view of its bytes."""
    fmt, raw, shape = t
    if shape[0] < r1:
        raise f.fail(f"variable {name!r} has {shape[0]} rows, expected {r1}")
    row = raw.size // shape[0]
    return fmt, raw[r0 * row:r1 * row], (r1 - r0, *shape[1:])


def _linear(f: CT2File, src: str, dst: str, out: dict[str, Tensor]) -> None:
    out[dst + ".weight"] = f.tensor(src + "/weight")
    out[dst + ".bias"] = f.tensor(src + "/bias")


def _norm(f: CT2File, src: str, dst: str, out: dict[str, Tensor]) -> None:
    out[dst + ".weight"] = f.tensor(src + "/gamma")
    out[dst + ".bias"] = f.tensor(src + "/beta")


def _split(f: CT2File, src: str, dst: str, parts: tuple[str, ...], d: int, out: dict[str, Tensor]) -> None:
    """A fused linear (q|k|v or k|v) as one tensor per part, each d rows; no k bias (see the module's doc)."""
    w, b = f.tensor(src + "/weight"), f.tensor(src + "/bias")
    if w[2][0] != len(parts) * d or b[2] != (len(parts) * d,):
        raise f.fail(f"{src} has shape {list(w[2])} and bias {list(b[2])}, expected {len(parts)} x {d} rows")
    for k, part in enumerate(parts):
        out[f"{dst}.{part}_proj.weight"] = _rows(f, w, k * d, (k + 1) * d, src + "/weight")
        if part != "k":
            out[f"{dst}.{part}_proj.bias"] = _rows(f, b, k * d, (k + 1) * d, src + "/bias")


def hf_tensors(f: CT2File, dims: WhisperDims) -> dict[str, Tensor]:
    """Every tensor the layout reads, by Hugging Face name (shapes are checked when the layout asks)."""
    d, out = dims.d_model, dict[str, Tensor]()
    e, dec = "model.encoder.", "model.decoder."
    for conv in ("conv1", "conv2"):
        _linear(f, f"encoder/{conv}", e + conv, out)
    out[e + "embed_positions.weight"] = f.tensor("encoder/position_encodings/encodings")
    _norm(f, "encoder/layer_norm", e + "layer_norm", out)
    out[dec + "embed_tokens.weight"] = f.tensor("decoder/embeddings/weight")
    out[dec + "embed_positions.weight"] = f.tensor("decoder/position_encodings/encodings")
    _norm(f, "decoder/layer_norm", dec + "layer_norm", out)
    _check_tied(f)
    for side, n_layers, hf in (("encoder", dims.encoder_layers, e), ("decoder", dims.decoder_layers, dec)):
        for n in range(n_layers):
            src, dst = f"{side}/layer_{n}/", f"{hf}layers.{n}."
            _norm(f, src + "self_attention/layer_norm", dst + "self_attn_layer_norm", out)
            _split(f, src + "self_attention/linear_0", dst + "self_attn", ("q", "k", "v"), d, out)
            _linear(f, src + "self_attention/linear_1", dst + "self_attn.out_proj", out)
            if side == "decoder":
                _norm(f, src + "attention/layer_norm", dst + "encoder_attn_layer_norm", out)
                _linear(f, src + "attention/linear_0", dst + "encoder_attn.q_proj", out)
                _split(f, src + "attention/linear_1", dst + "encoder_attn", ("k", "v"), d, out)
                _linear(f, src + "attention/linear_2", dst + "encoder_attn.out_proj", out)
            _norm(f, src + "ffn/layer_norm", dst + "final_layer_norm", out)
            _linear(f, src + "ffn/linear_0", dst + "fc1", out)
            _linear(f, src + "ffn/linear_1", dst + "fc2", out)
    return out


def _check_tied(f: CT2File) -> None:
    """The output projection must be the token embeddings (an alias, or the same bytes) and have no bias."""
    proj, embed = "decoder/projection/weight", "decoder/embeddings/weight"
    if proj in f and f.aliases.get(proj) != embed:
        a, b = f.variable(proj), f.variable(embed)
        if a.dtype != b.dtype or a.shape != b.shape or not np.array_equal(a.raw, b.raw):
            raise f.fail(f"{proj} is not the token embeddings: nvllm's Whisper ties them, as Hugging Face's does")
    bias = "decoder/projection/bias"
    if bias in f and np.any(f.variable(bias).values()):
        raise f.fail(f"{bias} is not zero: Whisper's logits have no bias")


def _tokenizer(folder: Path, vocab_size: int) -> Tokenizer:
    """tokenizer.json (faster-whisper's folders have it), else vocabulary.txt (every token, one a line, as
    CTranslate2's converter writes it), completed with the timestamps it lacks."""
    path = folder / "tokenizer.json"
    try:
        if path.is_file():
            try:
                backend = _Backend.from_file(str(path))
            except Exception as e:   # the Rust side raises plain Exception
                raise ValueError(f"cannot load: {e}") from None
            specials = specials_from_tokenizer(Tokenizer(backend, source=str(path)), vocab_size)
            add_whisper_specials(backend, specials)
            return whisper_tokenizer(backend, specials, str(folder))
        path = folder / "vocabulary.txt"
        if not path.is_file():
            raise ModelLoadError(f"{folder}: neither tokenizer.json nor vocabulary.txt is there")
        return _from_vocabulary(path, vocab_size)
    except ModelLoadError:
        raise
    except KeyError as e:
        raise ModelLoadError(f"{path}: the token {e.args[0]} is missing") from None
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{path}: {e}") from None


def _from_vocabulary(path: Path, vocab_size: int) -> Tokenizer:
    """vocabulary.txt's BPE tokens (byte-level strings, in id order) read back into bytes."""
    if path.stat().st_size > 64 << 20:
        raise ValueError(f"{path.stat().st_size} bytes is no Whisper vocabulary")
    lines = path.read_text(encoding="utf-8").split("\n")
    eot = whisper_specials(vocab_size).eot
    byte_of = {c: b for b, c in enumerate(BYTE_CHARS)}
    tokens = []
    for i, line in enumerate(lines[:eot]):
        if any(c not in byte_of for c in line):
            raise ValueError(f"line {i + 1} is not a byte-level BPE token")
        tokens.append(bytes(byte_of[c] for c in line))
    return tokenizer_from_bytes(tokens, vocab_size, str(path))


def _config(folder: Path, dims: WhisperDims, tok: Tokenizer) -> WhisperConfig:
    """config.json's tables (CTranslate2's names) with the sizes and the tokenizer's specials; a table it lacks
    is what openai-whisper would use."""
    where = folder / "config.json"
    ct2: dict[str, Any] = {}
    if where.is_file():
        try:
            ct2 = json.loads(where.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ModelLoadError(f"{where}: cannot read ({e})") from None
        if not isinstance(ct2, dict):
            raise ModelLoadError(f"{where}: not a JSON object")
    try:
        s = specials_from_tokenizer(tok, dims.vocab_size)
    except KeyError as e:
        raise ModelLoadError(f"{folder}: the tokenizer lacks {e.args[0]}") from None
    suppress = ct2.get("suppress_ids")
    begin = ct2.get("suppress_ids_begin")
    heads = ct2.get("alignment_heads")
    return whisper_config(dims, s, suppress_tokens(tok, s) if suppress is None else suppress,
                          begin_suppress(tok, s) if begin is None else begin,
                          default_alignment_heads(dims) if heads is None else heads, str(where),
                          ct2.get("lang_ids"))
