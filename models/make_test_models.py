#!/usr/bin/env python3
"""Write tiny, deterministic, random-weight model folders in Hugging Face layout.

    python models/make_test_models.py [--out models] [--only NAME] [--qwen05b]

Each folder takes under a second and is byte-identical on every run: seeded NumPy weights, and a byte-level
BPE tokenizer trained by `tokenizers` on a fixed built-in corpus, one thread. Tests call `make_all(out_dir)`.

  tiny-llama      LlamaForCausalLM, float32, untied lm_head, llama3 rope_scaling (old config form)
  tiny-qwen2      Qwen2ForCausalLM, bfloat16, q/k/v biases, tied, 2 shards, `rope_parameters` form
  tiny-llama-f16  LlamaForCausalLM, float16, tied, plain rope
  tiny-qwen3      Qwen3ForCausalLM, bfloat16, q/k norms, head_dim 24 (not hidden / heads), tied, GQA
  tiny-gemma3     Gemma3ForCausalLM, bfloat16, sliding and global layers, window 8 (tiny_gemma3.py)
  tiny-phi3, tiny-smollm3  Phi-3's partial rotary and longrope, SmolLM3's NoPE layers (tiny_rope_models.py)
  tiny-bert, tiny-bert-cls, tiny-bert-reranker  BERT embedding (sentence-transformers mean / CLS + Dense pooling)
                  and reranking folders with a WordPiece tokenizer, float32 (tiny_encoders.py)
  tiny-xlmr-reranker  XLMRobertaForSequenceClassification with a SentencePiece Unigram tokenizer (tiny_xlmr.py)
  tiny-nomic-bert NomicBertModel (rotary, SwiGLU) as nomic-embed-text-v1.5's folder, mean pooling (tiny_nomic.py)
  tiny-whisper, tiny-whisper-f16, tiny-whisper-multi, tiny-whisper-v3  WhisperForConditionalGeneration with
                  Whisper's real tokenizer (tiny_whisper.py); made by --only NAME or on demand by the tests
  --qwen05b       qwen2.5-0.5b-random: Qwen2.5-0.5B's shapes, random float32 (about 2 GB), for speed
"""
from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))   # the makers beside this file, imported by name

import tiny_encoders  # noqa: E402
import tiny_gemma3  # noqa: E402
import tiny_nomic  # noqa: E402
import tiny_rope_models  # noqa: E402
import tiny_whisper  # noqa: E402
import tiny_xlmr  # noqa: E402
from tiny_kit import (  # noqa: E402
    ENDOFTEXT_ID,
    IM_END_ID,
    IM_START_ID,
    Tokenizer,
    llama_config,
    train_tokenizer,
    write_json,
    write_tokenizer,
    write_weights,
)


def make_tiny_llama(out: Path, tok: Tokenizer) -> None:
    cfg = llama_config(tok.get_vocab_size(), "float32", tied=False)
    cfg["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                           "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    write_json(out / "config.json", cfg)
    write_json(out / "generation_config.json",
               {"bos_token_id": IM_START_ID, "eos_token_id": IM_END_ID,
                "pad_token_id": ENDOFTEXT_ID})
    write_tokenizer(out, tok, bos_token="<|im_start|>")
    write_weights(out, cfg, "float32", seed=1, bias=False, std=0.08, embed_std=0.15)


def make_tiny_llama_f16(out: Path, tok: Tokenizer) -> None:
    cfg = llama_config(tok.get_vocab_size(), "float16", tied=True)
    write_json(out / "config.json", cfg)
    write_json(out / "generation_config.json",
               {"bos_token_id": IM_START_ID, "eos_token_id": IM_END_ID})
    write_tokenizer(out, tok, bos_token="<|im_start|>")
    write_weights(out, cfg, "float16", seed=3, bias=False, std=0.08, embed_std=0.15)


def _qwen2_config(vocab: int, dtype: str, **shape: int) -> dict:
    cfg = {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_act": "silu",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "max_window_layers": 2,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        "sliding_window": None,
        "use_sliding_window": False,
        "tie_word_embeddings": True,
        "vocab_size": vocab,
        "bos_token_id": ENDOFTEXT_ID,
        "eos_token_id": IM_END_ID,
        "torch_dtype": dtype,
        "use_cache": True,
    }
    cfg.update(shape)
    return cfg


def make_tiny_qwen2(out: Path, tok: Tokenizer) -> None:
    tok = train_tokenizer(qwen2=True)
    cfg = _qwen2_config(tok.get_vocab_size(), "bfloat16")
    write_json(out / "config.json", cfg)
    write_json(out / "generation_config.json",
               {"bos_token_id": ENDOFTEXT_ID, "eos_token_id": [IM_END_ID, ENDOFTEXT_ID],
                "pad_token_id": ENDOFTEXT_ID})
    write_tokenizer(out, tok, bos_token=None, tokenizer_class="Qwen2Tokenizer")
    write_weights(out, cfg, "bfloat16", seed=2, bias=True, std=0.08, embed_std=0.15,
                  num_shards=2)


def make_tiny_qwen3(out: Path, tok: Tokenizer) -> None:
    """Qwen3's layout as its real configs write it: head_dim given, and here not hidden / heads (so q's
    projection is 96 wide against a hidden size of 64); rope_theta at the top, rope_scaling null."""
    tok = train_tokenizer(qwen2=True)   # Qwen3 ships Qwen2's tokenizer
    cfg = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "hidden_act": "silu",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 24,
        "max_position_embeddings": 512,
        "max_window_layers": 2,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "sliding_window": None,
        "use_sliding_window": False,
        "tie_word_embeddings": True,
        "vocab_size": tok.get_vocab_size(),
        "bos_token_id": ENDOFTEXT_ID,
        "eos_token_id": IM_END_ID,
        "torch_dtype": "bfloat16",
        "use_cache": True,
    }
    write_json(out / "config.json", cfg)
    write_json(out / "generation_config.json",
               {"bos_token_id": ENDOFTEXT_ID, "eos_token_id": [IM_END_ID, ENDOFTEXT_ID],
                "pad_token_id": ENDOFTEXT_ID})
    write_tokenizer(out, tok, bos_token=None, tokenizer_class="Qwen2Tokenizer")
    write_weights(out, cfg, "bfloat16", seed=5, bias=False, std=0.08, embed_std=0.15, qk_norm=True)


def make_qwen05b_random(out: Path, tok: Tokenizer) -> None:
    """Qwen2.5-0.5B's shapes with random weights; the tokenizer covers only the first rows."""
    cfg = _qwen2_config(151936, "float32", hidden_size=896, intermediate_size=4864,
                        num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                        max_position_embeddings=32768, max_window_layers=24)
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 1000000.0}
    write_json(out / "config.json", cfg)
    write_json(out / "generation_config.json",
               {"bos_token_id": ENDOFTEXT_ID, "eos_token_id": [IM_END_ID, ENDOFTEXT_ID]})
    write_tokenizer(out, tok, bos_token=None)
    # Four shards keep peak memory near a quarter of the 2 GB checkpoint.
    write_weights(out, cfg, "float32", seed=4, bias=True, std=0.02, embed_std=0.02,
                  num_shards=4)


BUILDERS: dict[str, Callable[[Path, Tokenizer], None]] = {
    "tiny-llama": make_tiny_llama,
    "tiny-qwen2": make_tiny_qwen2,
    "tiny-llama-f16": make_tiny_llama_f16,
    "tiny-qwen3": make_tiny_qwen3,
    "tiny-gemma3": tiny_gemma3.make,
    **tiny_rope_models.ROPE_BUILDERS,
    **tiny_encoders.ENCODER_BUILDERS,
    **tiny_xlmr.XLMR_BUILDERS,
    **tiny_nomic.NOMIC_BUILDERS,
}
EXTRA_BUILDERS: dict[str, Callable[[Path, Tokenizer], None]] = {
    "qwen2.5-0.5b-random": make_qwen05b_random,
    **tiny_whisper.WHISPER_BUILDERS,
}


def make_one(name: str, out_dir: Path, tok: Tokenizer | None = None) -> Path:
    """(Re)write one folder from scratch, through a temporary sibling renamed into place."""
    builder = {**BUILDERS, **EXTRA_BUILDERS}[name]
    tok = tok or train_tokenizer()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    final, tmp = out_dir / name, out_dir / f".{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    builder(tmp, tok)
    for f in tmp.rglob("*"):
        f.chmod(0o755 if f.is_dir() else 0o644)  # safetensors creates files owner-only; subfolders stay open
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    return final


def make_all(out_dir, only: list[str] | None = None) -> dict[str, Path]:
    """Write every tiny model (or those in `only`) under out_dir; returns name -> folder."""
    tok = train_tokenizer()
    return {n: make_one(n, Path(out_dir), tok) for n in (only or list(BUILDERS))}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent),
                    help="where the folders go (default: this script's folder)")
    ap.add_argument("--only", action="append", choices=sorted({**BUILDERS, **EXTRA_BUILDERS}),
                    help="make only this model (repeatable)")
    ap.add_argument("--qwen05b", action="store_true", help="also write qwen2.5-0.5b-random (2 GB, random)")
    args = ap.parse_args(argv)
    names = list(args.only or BUILDERS)
    if args.qwen05b and "qwen2.5-0.5b-random" not in names:
        names.append("qwen2.5-0.5b-random")
    tok = train_tokenizer()
    for n in names:
        print(make_one(n, Path(args.out), tok))


if __name__ == "__main__":
    main()
