"""Write the embedding and reranking goldens for the tiny BERT folders, using transformers + torch.

Like make_golden.py (beside this script) it runs once, by hand, in the separate venv, and its output is
committed; nvllm's tests only read it. From the repository root:

    python3 -m venv .refvenv
    .refvenv/bin/pip install torch==2.13.0            # CPU wheel; pin it, other versions are huge
    .refvenv/bin/pip install transformers numpy safetensors tokenizers
    .refvenv/bin/pip install sentence-transformers    # optional: the cross-check below
    python models/make_test_models.py --only tiny-bert --only tiny-bert-cls --only tiny-bert-reranker \
        --only tiny-xlmr-reranker --only tiny-nomic-bert
    .refvenv/bin/python tests/golden/make_golden_pooling.py [--models-dir models] [--only NAME]

The sentence embedding is computed by hand from transformers' BertModel (NomicBertModel) output, as
sentence-transformers' modules do it: Pooling (mean over the tokens the attention mask keeps, or the [CLS] row),
then Dense (linear, then tanh) where the folder has one, then Normalize (L2, eps 1e-12). Where
sentence-transformers is installed, the script also runs the folders through it (SentenceTransformer.encode,
CrossEncoder.predict with no activation) and stops unless it agrees to 1e-5; it also stops unless a padded batch
of all the texts gives what each text gives alone, and unless transformers tokenizes as the folder's
tokenizer.json does (nvllm runs that file as it is; for tiny-xlmr-reranker also pooling_cases.UNIGRAM_TEXTS).
float32, eager attention, CPU, one thread: running twice gives byte-identical files.

tiny-nomic-bert's config.json is nomic's own (n_embd, n_layer, rotary_emb_base, ...): transformers 5 has a
NomicBertModel of its own, which reads nomic's tensor names (its conversion mapping: Wqkv split into q, k, v;
fc11 up, fc12 gate) but not nomic's config keys, so the script hands it a NomicBertConfig made from them
(nomic_config below), and stops unless every tensor of the checkpoint was loaded.

Writes, from the inputs in pooling_cases.py:
  pooling_tiny-bert.json, pooling_tiny-bert-cls.json, pooling_tiny-nomic-bert.json   per text / pair:
                          input_ids, token_type_ids, `pooled` (the Pooling module's output, before Dense and
                          Normalize) and `embedding` (the final sentence embedding)
  pooling_tiny-bert-reranker.json, pooling_tiny-xlmr-reranker.json   per (query, document): input_ids,
                          token_type_ids (XLM-R's tokenizer gives none: all 0, its one type) and `logit`, the raw
                          output of Bert- / XLMRobertaForSequenceClassification (no sigmoid)
Floats are written as the shortest decimal that reads back as the same float32.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import safetensors
import tokenizers
import torch
import transformers
from pooling_cases import EMBED_PAIRS, EMBED_TEXTS, RERANK_DOCUMENTS, RERANK_QUERY, UNIGRAM_TEXTS  # beside this script
from safetensors.numpy import load_file
from tokenizers import Tokenizer
from transformers import AutoModel, AutoModelForSequenceClassification, AutoTokenizer

EMBEDDERS = ("tiny-bert", "tiny-bert-cls", "tiny-nomic-bert")
RERANKERS = ("tiny-bert-reranker", "tiny-xlmr-reranker")
CROSS_CHECK_ATOL = 1e-5
SEED = 1234
GOLDEN_DIR = Path(__file__).resolve().parent

try:   # optional: only for the cross-check
    import sentence_transformers
except ImportError:
    sentence_transformers = None


def f32(values: Any) -> list[float]:
    """float32 values as the shortest decimals that read back as the same float32."""
    return [float(str(v)) for v in np.asarray(values, dtype=np.float32).ravel()]


def folder_fingerprint(model_dir: Path) -> dict[str, str]:
    """sha256 of every file in the folder and its module subfolders, so a test can tell these are stale."""
    files = sorted(p for p in model_dir.rglob("*") if p.is_file() and not p.name.startswith("."))
    return {p.relative_to(model_dir).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def versions() -> dict[str, str]:
    v = {"transformers": transformers.__version__, "torch": torch.__version__,
         "tokenizers": tokenizers.__version__, "safetensors": safetensors.__version__}
    if sentence_transformers is not None:
        v["sentence_transformers (cross-check)"] = sentence_transformers.__version__
    return v


def type_ids(enc: Any) -> list[int]:
    """transformers' token type ids; all 0 where its tokenizer gives none (XLM-R's: one token type)."""
    ids = enc["input_ids"]
    types = enc.get("token_type_ids")
    if types is None:
        return [0] * len(ids) if isinstance(ids, list) else [0] * len(ids[0])
    return types if isinstance(types, list) else types[0].tolist()


def check_tokenizer(model_dir: Path, tokenizer: Any, inputs: list[str | tuple[str, str]]) -> None:
    raw = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    for x in inputs:
        enc = raw.encode(*x) if isinstance(x, tuple) else raw.encode(x)
        theirs = tokenizer(*x) if isinstance(x, tuple) else tokenizer(x)
        if (enc.ids, enc.type_ids) != (theirs["input_ids"], type_ids(theirs)):
            raise SystemExit(f"{model_dir.name}: transformers does not tokenize {x!r} as tokenizer.json does")


def nomic_config(model_dir: Path) -> Any:
    """transformers' NomicBertConfig for a folder whose config.json has nomic's keys; None for any other."""
    cfg = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    if cfg.get("model_type") != "nomic_bert":
        return None
    if cfg["activation_function"] != "swiglu" or cfg["rotary_emb_fraction"] != 1.0 or cfg["rotary_emb_interleaved"]:
        raise SystemExit(f"{model_dir.name}: only SwiGLU and rotary over whole heads, NeoX's halves, are mapped")
    return transformers.NomicBertConfig(
        vocab_size=cfg["vocab_size"], hidden_size=cfg["n_embd"], num_hidden_layers=cfg["n_layer"],
        num_attention_heads=cfg["n_head"], head_dim=cfg["n_embd"] // cfg["n_head"], intermediate_size=cfg["n_inner"],
        hidden_act="silu", max_position_embeddings=cfg["max_trained_positions"],
        type_vocab_size=cfg["type_vocab_size"], layer_norm_eps=cfg["layer_norm_epsilon"], pad_token_id=0,
        rope_parameters={"rope_type": "default", "rope_theta": float(cfg["rotary_emb_base"])})


# ---------------------------------------------------------------- sentence-transformers' modules, by hand

def read_modules(model_dir: Path) -> tuple[str, tuple[torch.Tensor, torch.Tensor] | None, bool]:
    """(pooling mode, Dense's (weight, bias) or None, whether it normalizes) from the folder's modules.json."""
    mode, dense, normalize = "", None, False
    for mod in json.loads((model_dir / "modules.json").read_text(encoding="utf-8")):
        kind, sub = mod["type"].rsplit(".", 1)[-1], model_dir / mod["path"]
        if kind == "Pooling":
            cfg = json.loads((sub / "config.json").read_text(encoding="utf-8"))
            modes = [m for m in ("mean_tokens", "cls_token") if cfg.get(f"pooling_mode_{m}")]
            if len(modes) != 1 or any(v for k, v in cfg.items() if k.startswith("pooling_mode_")
                                      and k[len("pooling_mode_"):] not in modes):
                raise SystemExit(f"{model_dir.name}: only one of mean / cls pooling is handled, got {cfg}")
            mode = modes[0]
        elif kind == "Dense":
            cfg = json.loads((sub / "config.json").read_text(encoding="utf-8"))
            if cfg["activation_function"] != "torch.nn.modules.activation.Tanh" or not cfg["bias"]:
                raise SystemExit(f"{model_dir.name}: only Dense with bias and tanh is handled, got {cfg}")
            w = load_file(str(sub / "model.safetensors"))
            dense = (torch.from_numpy(w["linear.weight"]), torch.from_numpy(w["linear.bias"]))
        elif kind == "Normalize":
            normalize = True
        elif kind != "Transformer":
            raise SystemExit(f"{model_dir.name}: module {mod['type']} is not handled")
    return mode, dense, normalize


@torch.no_grad()
def embed(model: Any, enc: dict[str, torch.Tensor], mode: str,
          dense: tuple[torch.Tensor, torch.Tensor] | None, normalize: bool) -> tuple[np.ndarray, np.ndarray]:
    """[B, T] ids -> (pooled [B, H], embedding [B, D]) float32."""
    hidden = model(**enc).last_hidden_state                        # [B, T, H]
    mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)     # [B, T, 1]
    if mode == "mean_tokens":
        pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)   # [B, H]
    else:
        pooled = hidden[:, 0]                                       # [B, H]: the [CLS] row
    out = pooled
    if dense is not None:
        out = torch.tanh(torch.nn.functional.linear(out, *dense))   # [B, H] -> [B, D]
    if normalize:
        out = torch.nn.functional.normalize(out, p=2, dim=-1)
    return pooled.numpy().copy(), out.numpy().copy()


# ---------------------------------------------------------------- the goldens

def embedding_golden(name: str, model_dir: Path) -> dict[str, Any]:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    config = nomic_config(model_dir)
    model, loading = AutoModel.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager",
                                               output_loading_info=True, **({"config": config} if config else {}))
    model.eval()
    if any(loading[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")):
        raise SystemExit(f"{name}: transformers did not load the checkpoint whole: {loading}")
    inputs: list[str | tuple[str, str]] = [*EMBED_TEXTS, *EMBED_PAIRS]
    check_tokenizer(model_dir, tokenizer, inputs)
    mode, dense, normalize = read_modules(model_dir)
    cases = []
    for x in inputs:
        enc = tokenizer(*x, return_tensors="pt") if isinstance(x, tuple) else tokenizer(x, return_tensors="pt")
        pooled, emb = embed(model, dict(enc), mode, dense, normalize)
        cases.append({"kind": "pair" if isinstance(x, tuple) else "text", "text": list(x) if isinstance(x, tuple)
                      else x, "input_ids": enc["input_ids"][0].tolist(),
                      "token_type_ids": enc["token_type_ids"][0].tolist(), "pooled": f32(pooled[0]),
                      "embedding": f32(emb[0])})
    embs = np.array([c["embedding"] for c in cases], dtype=np.float32)

    # A padded batch must give what each input gives alone (the mask keeps padding out of attention and mean).
    batch = tokenizer(list(EMBED_TEXTS), padding=True, return_tensors="pt")
    _, batch_embs = embed(model, dict(batch), mode, dense, normalize)
    gap = float(np.abs(batch_embs - embs[: len(EMBED_TEXTS)]).max())
    if gap > CROSS_CHECK_ATOL:
        raise SystemExit(f"{name}: padded batch differs from single runs by {gap}")
    report: dict[str, Any] = {"model": name, "pooling": mode, "dense": dense is not None, "batch_gap": gap}
    if sentence_transformers is not None:
        st = sentence_transformers.SentenceTransformer(str(model_dir), device="cpu",
                                                       config_kwargs=config.to_diff_dict() if config else None)
        st_embs = st.encode(list(EMBED_TEXTS), convert_to_numpy=True, batch_size=len(EMBED_TEXTS))
        report["sentence_transformers_gap"] = gap = float(np.abs(st_embs - embs[: len(EMBED_TEXTS)]).max())
        if gap > CROSS_CHECK_ATOL:
            raise SystemExit(f"{name}: sentence-transformers differs from the embedding by hand by {gap}")
    cos = embs @ embs.T
    report["cosine_off_diagonal"] = [float(cos[~np.eye(len(cos), dtype=bool)].min()),
                                     float(cos[~np.eye(len(cos), dtype=bool)].max())]
    info = {"model": name, "folder_sha256": folder_fingerprint(model_dir), "versions": versions(),
            "settings": "float32, eager attention, CPU, one thread", "pooling": mode,
            "dense": None if dense is None else {"in_features": int(dense[0].shape[1]),
                                                 "out_features": int(dense[0].shape[0]), "activation": "tanh"},
            "normalize": normalize, "dimension": int(embs.shape[1])}
    return {"info": info, "cases": cases, "report": report}


@torch.no_grad()
def rerank_golden(name: str, model_dir: Path) -> dict[str, Any]:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager").eval()
    pairs = [(RERANK_QUERY, d) for d in RERANK_DOCUMENTS]
    unigram = list(UNIGRAM_TEXTS) if (model_dir / "sentencepiece.bpe.model").is_file() else []
    check_tokenizer(model_dir, tokenizer, [*pairs, *unigram])
    cases = []
    for q, d in pairs:
        enc = tokenizer(q, d, return_tensors="pt")
        logit = model(**enc).logits[0, 0]
        cases.append({"query": q, "document": d, "input_ids": enc["input_ids"][0].tolist(),
                      "token_type_ids": type_ids(enc), "logit": f32(logit.numpy())[0]})
    logits = np.array([c["logit"] for c in cases], dtype=np.float32)
    batch = tokenizer([q for q, _ in pairs], [d for _, d in pairs], padding=True, return_tensors="pt")
    gap = float(np.abs(model(**batch).logits[:, 0].numpy() - logits).max())
    if gap > CROSS_CHECK_ATOL:
        raise SystemExit(f"{name}: padded batch differs from single runs by {gap}")
    report: dict[str, Any] = {"model": name, "logits": logits.tolist(), "batch_gap": gap}
    if sentence_transformers is not None:
        ce = sentence_transformers.CrossEncoder(str(model_dir), device="cpu")
        scores = ce.predict(pairs, activation_fn=torch.nn.Identity(), convert_to_numpy=True)
        report["sentence_transformers_gap"] = gap = float(np.abs(np.asarray(scores) - logits).max())
        if gap > CROSS_CHECK_ATOL:
            raise SystemExit(f"{name}: CrossEncoder differs from the sequence classifier by {gap}")
    info = {"model": name, "folder_sha256": folder_fingerprint(model_dir), "versions": versions(),
            "settings": "float32, eager attention, CPU, one thread", "output": "raw logit, no sigmoid"}
    return {"info": info, "cases": cases, "report": report}


def write(path: Path, info: dict[str, Any], cases: list[dict[str, Any]]) -> None:
    """One key per line, then one case per line: small and still diffable."""
    head = json.dumps(info, ensure_ascii=False, indent=1)
    body = ",\n".join("  " + json.dumps(c, ensure_ascii=False) for c in cases)
    path.write_text(head[:-2] + ',\n "cases": [\n' + body + "\n ]\n}\n", encoding="utf-8")
    path.chmod(0o644)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models-dir", type=Path, default=Path("models"))
    parser.add_argument("--out", type=Path, default=GOLDEN_DIR)
    parser.add_argument("--only", action="append", choices=EMBEDDERS + RERANKERS,
                        help="model folder name (repeatable)")
    args = parser.parse_args(argv)

    torch.manual_seed(SEED)
    torch.set_num_threads(1)   # one thread: the same float sums, hence the same bytes, on every run
    torch.use_deterministic_algorithms(True)
    print(json.dumps(versions()), file=sys.stderr)
    for name in args.only or EMBEDDERS + RERANKERS:
        model_dir = args.models_dir / name
        if not (model_dir / "config.json").is_file():
            raise SystemExit(f"no {model_dir}: run models/make_test_models.py first")
        before = folder_fingerprint(model_dir)
        made = (rerank_golden if name in RERANKERS else embedding_golden)(name, model_dir)
        if folder_fingerprint(model_dir) != before:
            raise SystemExit(f"{name}: the model folder changed while the goldens were made; run again")
        write(args.out / f"pooling_{name}.json", made["info"], made["cases"])
        print(json.dumps(made["report"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
