"""Write the tiny Whisper models' goldens (tests/golden/whisper/) with transformers + torch, which nvllm never imports.

    .refvenv/bin/python tools/whisper_goldens_model.py [--models-dir /tmp/whisper-models] [--only NAME]

Each tiny folder of models/tiny_whisper.py is made afresh (seeded: the same bytes every run), loaded by
transformers' WhisperForConditionalGeneration in float32 (eager attention, one thread), and run on the stand-in
features tiny_whisper.golden_features(n_mels, case) of two cases. Per model NAME:

  NAME.safetensors  case<k>_encoder_rows [12, d]: the encoder's last states at frames 0-3, 748-751, 1496-1499;
                    case<k>_encoder_sum [d]: their sum over all 1500 frames;
                    case<k>_prompt [L] int64: a forced decoder prompt (case 0: <|startoftranscript|> (language,
                    task) <|notimestamps|> and a sentence's tokens; case 1 the same after <|startofprev|> and
                    earlier text, past one 16-token page); case<k>_argmax [L] and case<k>_logsumexp [L] of every
                    row's logits over the whole vocabulary; vocab_subset [512] (each row's top 4 and seeded ids)
                    and case<k>_logits [L, 512] at those ids.
  NAME.json         per case the greedy tokens of model.generate (num_beams=1, do_sample=False, max_new_tokens 24,
                    return_timestamps=False; language "en" and task "transcribe" on a multilingual model; the
                    generation_config's suppress_tokens and begin_suppress_tokens apply), the prompt generate
                    built, each step's margin (top-1 minus top-2 of the processed scores), the kwargs and versions.

and tests/golden/tiny_whisper_transcripts.json: for tiny-whisper and tiny-whisper-multi, the greedy transcript of
each clip of tests/data/speech (16-bit WAV, 16 kHz) as transformers' WhisperFeatureExtractor (padded to 30 s) and
generate give it: the same kwargs, max_new_tokens 224 (openai-whisper's sample_len); "tokens" the ids after the
forced prefix without a final <|endoftext|>, "stopped_at_eos", "margins" and "min_margin".
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import wave
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors.numpy import save_file
from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "models"))
import tiny_whisper  # noqa: E402

OUT = ROOT / "tests" / "golden" / "whisper"
TRANSCRIPTS = ROOT / "tests" / "golden" / "tiny_whisper_transcripts.json"
SPEECH = ROOT / "tests" / "data" / "speech"
SAMPLE_LEN = 224
ROWS = [0, 1, 2, 3, 748, 749, 750, 751, 1496, 1497, 1498, 1499]
SUBSET = 512
MAX_NEW = 24
TEXT = [" The drone flies north over the field.", " Battery at 87 percent, return home now please."]


def folder_sha256(folder: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(folder.iterdir()):
        h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()


def prompts(tok: Tokenizer, cfg: dict, gen: dict) -> list[list[int]]:
    names = ("<|startoftranscript|>", "<|notimestamps|>", "<|startofprev|>")
    ids = {t: int(tok.token_to_id(t) or 0) for t in names}
    start = [ids["<|startoftranscript|>"]]
    if gen.get("is_multilingual"):
        start += [gen["lang_to_id"]["<|en|>"], gen["task_to_id"]["transcribe"]]
    start.append(ids["<|notimestamps|>"])
    words = [tok.encode(t, add_special_tokens=False).ids for t in TEXT]
    return [start + words[0], [ids["<|startofprev|>"]] + words[1] + words[0] + start + words[1]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models-dir", default="/tmp/whisper-models")
    ap.add_argument("--only", action="append", choices=sorted(tiny_whisper.WHISPER_BUILDERS))
    args = ap.parse_args()
    torch.set_num_threads(1)
    OUT.mkdir(parents=True, exist_ok=True)
    folders = {}
    for name in args.only or sorted(tiny_whisper.WHISPER_BUILDERS):
        folder = Path(args.models_dir) / name
        folder.mkdir(parents=True, exist_ok=True)
        tiny_whisper.WHISPER_BUILDERS[name](folder, None)
        write(name, folder)
        folders[name] = folder
    if not args.only:
        transcripts = {name: transcribe(folders[name]) for name in ("tiny-whisper", "tiny-whisper-multi")}
        TRANSCRIPTS.write_text(json.dumps(transcripts, indent=1) + "\n")


def clip(path: Path) -> np.ndarray:
    with wave.open(str(path)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 16000), path
        return np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768


def transcribe(folder: Path) -> dict[str, dict]:
    """Each clip's greedy transcript (see the docstring)."""
    gen = json.loads((folder / "generation_config.json").read_text())
    model = transformers.WhisperForConditionalGeneration.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager").eval()
    extractor = transformers.WhisperFeatureExtractor.from_pretrained(folder)
    out = {}
    for path in sorted(SPEECH.glob("*.wav")):
        feats = extractor(clip(path), sampling_rate=16000, return_tensors="pt").input_features
        kwargs: dict[str, object] = {"num_beams": 1, "do_sample": False, "max_new_tokens": SAMPLE_LEN,
                                     "return_timestamps": False}
        if gen.get("is_multilingual"):
            kwargs.update(language="en", task="transcribe")
        with torch.no_grad():
            res = model.generate(input_features=feats, return_dict_in_generate=True, output_scores=True, **kwargs)
        seq = res.sequences[0].tolist()
        margins = [float(np.diff(np.sort(s[0].numpy())[-2:])[0]) for s in res.scores]
        new = seq[len(seq) - len(margins):]
        stopped = bool(new) and new[-1] == gen["eos_token_id"]
        out[path.stem] = {"generate_kwargs": kwargs, "prompt": seq[:len(seq) - len(margins)],
                          "tokens": new[:-1] if stopped else new, "stopped_at_eos": stopped, "margins": margins,
                          "min_margin": min(margins)}
    print(folder.name, {k: (len(v["tokens"]), round(v["min_margin"], 4)) for k, v in out.items()})
    return out


def write(name: str, folder: Path) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    gen = json.loads((folder / "generation_config.json").read_text())
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    model = transformers.WhisperForConditionalGeneration.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager").eval()
    tensors: dict[str, np.ndarray] = {}
    rows: list[np.ndarray] = []
    cases = []
    for k, prompt in enumerate(prompts(tok, cfg, gen)):
        feats = torch.from_numpy(tiny_whisper.golden_features(cfg["num_mel_bins"], k))[None]
        with torch.no_grad():
            states = model.model.encoder(feats).last_hidden_state[0].numpy()
            logits = model(input_features=feats, decoder_input_ids=torch.tensor([prompt])).logits[0].numpy()
        tensors[f"case{k}_encoder_rows"] = np.ascontiguousarray(states[ROWS])
        tensors[f"case{k}_encoder_sum"] = states.astype(np.float64).sum(axis=0).astype(np.float32)
        tensors[f"case{k}_prompt"] = np.asarray(prompt, np.int64)
        tensors[f"case{k}_argmax"] = logits.argmax(axis=1).astype(np.int64)
        top = logits.astype(np.float64).max(axis=1, keepdims=True)
        lse = top[:, 0] + np.log(np.exp(logits.astype(np.float64) - top).sum(axis=1))
        tensors[f"case{k}_logsumexp"] = lse.astype(np.float32)
        rows.append(logits)
        kwargs: dict[str, object] = {"num_beams": 1, "do_sample": False, "max_new_tokens": MAX_NEW,
                                     "return_timestamps": False}
        if gen.get("is_multilingual"):
            kwargs.update(language="en", task="transcribe")
        with torch.no_grad():
            out = model.generate(input_features=feats, return_dict_in_generate=True, output_scores=True, **kwargs)
        seq = out.sequences[0].tolist()
        scores = [s[0].numpy() for s in out.scores]
        margins = [float(np.sort(s)[-1] - np.sort(s)[-2]) for s in scores]
        new = seq[len(seq) - len(scores):]
        cases.append({"case": k, "generate_kwargs": kwargs, "sequence": seq, "prompt": seq[:len(seq) - len(scores)],
                      "generated": new, "margins": margins, "min_margin": min(margins)})
    rng = np.random.default_rng(7)
    chosen = set()
    for logits in rows:
        chosen |= set(np.argsort(-logits, axis=1)[:, :4].ravel().tolist())
    rest = np.setdiff1d(np.arange(cfg["vocab_size"]), sorted(chosen))
    subset = np.sort(np.concatenate([sorted(chosen), rng.choice(rest, SUBSET - len(chosen), replace=False)]))
    tensors["vocab_subset"] = subset.astype(np.int64)
    for k, logits in enumerate(rows):
        tensors[f"case{k}_logits"] = np.ascontiguousarray(logits[:, subset])
    meta = {"model": name, "transformers": transformers.__version__, "torch": torch.__version__,
            "folder_sha256": folder_sha256(folder)}
    save_file(tensors, str(OUT / f"{name}.safetensors"), metadata={"golden": json.dumps(meta)})
    (OUT / f"{name}.safetensors").chmod(0o644)
    (OUT / f"{name}.json").write_text(json.dumps({**meta, "greedy": cases}, indent=1) + "\n")
    print(name, [c["min_margin"] for c in cases], [len(c["generated"]) for c in cases])


if __name__ == "__main__":
    main()
