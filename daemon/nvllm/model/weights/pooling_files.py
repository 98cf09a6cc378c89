"""The pooling a Hugging Face folder names: sentence-transformers' modules.json and its modules' folders
(Pooling's config.json, Dense's config.json and weights, Normalize), and config.json's Matryoshka sizes.
A folder without modules.json gets the task's usual pooling (vLLM's): CLS for an encoder, the last token
for a decoder, both normalized."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file

from nvllm.model.config import ModelLoadError, read_json
from nvllm.model.pooler import DenseLayer, Pooling

_MODULE = "sentence_transformers.models."
_ACTIVATIONS = {"torch.nn.modules.activation.Tanh": "tanh", "torch.nn.modules.linear.Identity": "identity"}
# Pooling's config.json flags -> nvllm's method; the others (max, mean_sqrt_len, weightedmean) are refused.
_MODES = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean", "pooling_mode_lasttoken": "last"}
_NAMED = {"cls": "cls", "mean": "mean", "lasttoken": "last"}


def read_pooling(model_dir: Path, default: str, cfg: dict[str, Any]) -> Pooling:
    """The folder's pooling; `default` ("cls" or "last") where it names none; cfg: its config.json."""
    sizes = tuple(int(d) for d in cfg.get("matryoshka_dimensions") or ())
    shorter = bool(cfg.get("is_matryoshka")) and not sizes
    modules_file = model_dir / "modules.json"
    if not modules_file.exists():
        return Pooling(default, normalize=True, matryoshka=sizes, any_dimensions=shorter)
    modules = read_json(modules_file)
    if not isinstance(modules, list):
        raise ModelLoadError(f"{modules_file}: need a list of modules")
    method, dense, normalize = default, [], False
    for m in sorted(modules, key=lambda m: int(m.get("idx", 0)) if isinstance(m, dict) else 0):
        kind = str(m.get("type", "")) if isinstance(m, dict) else ""
        where = model_dir / str(m.get("path", "")) if isinstance(m, dict) else model_dir
        name = kind.removeprefix(_MODULE)
        if name == "Transformer":
            continue
        if name == "Pooling":
            method = _pooling_method(where / "config.json")
        elif name == "Dense":
            dense.append(_dense(where))
        elif name == "Normalize":
            normalize = True
        else:
            raise ModelLoadError(f"{modules_file}: module {kind!r} is not supported (supported: Transformer, "
                                 f"Pooling, Dense, Normalize)")
    return Pooling(method, tuple(dense), normalize, sizes, shorter)


def _pooling_method(path: Path) -> str:
    cfg = read_json(path)
    if isinstance(cfg.get("pooling_mode"), str):   # the newer form: one name
        named = cfg["pooling_mode"]
        if named not in _NAMED:
            raise ModelLoadError(f"{path}: pooling_mode {named!r} is not supported (supported: cls, mean, lasttoken)")
        return _NAMED[named]
    on = [k for k, v in cfg.items() if k.startswith("pooling_mode_") and v is True]
    if len(on) != 1 or on[0] not in _MODES:
        raise ModelLoadError(f"{path}: pooling {', '.join(on) or 'none'} is not supported (supported: exactly one "
                             f"of {', '.join(_MODES)})")
    return _MODES[on[0]]


def _dense(folder: Path) -> DenseLayer:
    cfg = read_json(folder / "config.json")
    act = str(cfg.get("activation_function", "torch.nn.modules.linear.Identity"))
    if act not in _ACTIVATIONS:
        raise ModelLoadError(f"{folder / 'config.json'}: activation_function {act!r} is not supported "
                             f"(supported: {', '.join(_ACTIVATIONS)})")
    weights = folder / "model.safetensors"
    if not weights.exists():
        raise ModelLoadError(f"{folder}: no model.safetensors for the Dense module (pickle weights are never "
                             f"opened)")
    try:
        tensors = load_file(str(weights))
    except Exception as e:   # safetensors' own errors name no common type
        raise ModelLoadError(f"{weights}: unreadable ({e})") from None
    out, inp = int(cfg.get("out_features", 0)), int(cfg.get("in_features", 0))
    w = tensors.get("linear.weight")
    if w is None or w.shape != (out, inp):
        got = None if w is None else list(w.shape)
        raise ModelLoadError(f"{weights}: linear.weight must be [{out}, {inp}] (out_features, in_features), got {got}")
    bias = tensors.get("linear.bias") if cfg.get("bias", True) else None
    if cfg.get("bias", True) and (bias is None or bias.shape != (out,)):
        raise ModelLoadError(f"{weights}: linear.bias must be [{out}]")
    return DenseLayer(np.ascontiguousarray(w, dtype=np.float32),
                      None if bias is None else np.asarray(bias, dtype=np.float32), _ACTIVATIONS[act])
