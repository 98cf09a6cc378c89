"""A folder's pooling as its files say (model/weights/pooling_files.py, model/pooler.py): sentence-transformers'
modules.json and its modules (both forms of Pooling's config, Dense, Normalize), the default without them, the
Matryoshka sizes config.json names; and everything else refused by name, never guessed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from nvllm.model.config import ModelLoadError
from nvllm.model.pooler import Pooling
from nvllm.model.weights.pooling_files import read_pooling


@pytest.fixture
def folder(tiny_encoders: dict[str, Path], tmp_path: Path) -> Path:
    out = tmp_path / "m"
    shutil.copytree(tiny_encoders["tiny-bert-cls"], out)
    return out


def pooling_config(folder: Path, **flags: object) -> None:
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32, **flags}))


def test_the_modules_are_read_in_order(folder: Path, tiny_encoders: dict[str, Path]) -> None:
    p = read_pooling(folder, "last", {})
    assert (p.method, p.normalize, len(p.dense)) == ("cls", True, 1)
    assert p.dense[0].weight.shape == (16, 32) and p.dense[0].activation == "tanh" and p.size(32) == 16
    mean = read_pooling(tiny_encoders["tiny-bert"], "cls", {})
    assert (mean.method, mean.normalize, mean.dense) == ("mean", True, ())


@pytest.mark.parametrize("flags, method", [({"pooling_mode_lasttoken": True}, "last"),
                                           ({"pooling_mode": "mean"}, "mean"), ({"pooling_mode": "lasttoken"}, "last"),
                                           ({"pooling_mode_cls_token": True, "pooling_mode_max_tokens": False}, "cls")])
def test_each_form_of_the_pooling_config(folder: Path, flags: dict[str, object], method: str) -> None:
    pooling_config(folder, **flags)
    assert read_pooling(folder, "cls", {}).method == method


def test_without_modules_json_the_tasks_default_normalized(folder: Path) -> None:
    (folder / "modules.json").unlink()
    assert read_pooling(folder, "cls", {}) == Pooling("cls", normalize=True)
    assert read_pooling(folder, "last", {"matryoshka_dimensions": [8, 16]}).matryoshka == (8, 16)


REFUSED = [
    ("pooling", {"pooling_mode_max_tokens": True}, "pooling pooling_mode_max_tokens is not supported"),
    ("pooling", {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": True}, "exactly one of"),
    ("pooling", {"pooling_mode": "weightedmean"}, "pooling_mode 'weightedmean' is not supported"),
    ("module", "sentence_transformers.models.LayerNorm", "module 'sentence_transformers.models.LayerNorm' is not"),
    ("activation", "torch.nn.modules.activation.ReLU", "activation_function 'torch.nn.modules.activation.ReLU'"),
    ("dense shape", None, "linear.weight must be [16, 32]"),
    ("pickle", None, "no model.safetensors for the Dense module"),
]


@pytest.mark.parametrize("what, value, words", REFUSED, ids=[r[0] for r in REFUSED])
def test_what_nvllm_cannot_compute_is_refused_by_name(folder: Path, what: str, value: object, words: str) -> None:
    dense = folder / "2_Dense"
    if what == "pooling":
        pooling_config(folder, **value)   # type: ignore[arg-type]
    elif what == "module":
        modules = json.loads((folder / "modules.json").read_text())
        modules[2]["type"] = value
        (folder / "modules.json").write_text(json.dumps(modules))
    elif what == "activation":
        cfg = json.loads((dense / "config.json").read_text())
        (dense / "config.json").write_text(json.dumps({**cfg, "activation_function": value}))
    elif what == "dense shape":
        save_file({"linear.weight": np.zeros((32, 16), np.float32), "linear.bias": np.zeros(16, np.float32)},
                  str(dense / "model.safetensors"))
    else:
        (dense / "model.safetensors").rename(dense / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match=words.replace("[", r"\[").replace("(", r"\(")):
        read_pooling(folder, "cls", {})


def test_dimensions_only_where_the_model_was_trained_for_them() -> None:
    plain, sizes, free = Pooling("mean"), Pooling("mean", matryoshka=(8, 16, 32)), Pooling("last", any_dimensions=True)
    assert "not supported by this model" in plain.check_dimensions(8, 32)
    assert sizes.check_dimensions(16, 32) == "" and "Matryoshka sizes 8, 16, 32" in sizes.check_dimensions(12, 32)
    assert free.check_dimensions(12, 32) == "" and "between 1 and the model's 32" in free.check_dimensions(40, 32)
    hidden = np.arange(2 * 32, dtype=np.float32).reshape(2, 32)
    cut = free(hidden, np.array([0]), np.array([2]), [12])[0]
    assert cut.shape == (12,) and abs(float(np.linalg.norm(cut)) - 1) < 1e-6   # cut, then normalized
    assert np.allclose(cut, hidden[1, :12] / np.linalg.norm(hidden[1, :12]))
