"""Which served model transcribes (server/models/speech_slot.py): server.speech_model, else the only speech model
served, found from the models' files once; none or several without the setting are refused naming model. And
the setting must name a served model when the daemon starts."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from nvllm.config import ConfigError, ModelEntry, Settings
from nvllm.server.models.model_set import ModelSet, ModelSpec
from nvllm.server.models.served_models import model_specs
from nvllm.server.models.speech_slot import NoSpeechModel, SpeechSlot


def models(*paths: str) -> ModelSet:
    specs = []
    for p in paths:
        s = Settings()
        s.model.path = p
        specs.append(ModelSpec(Path(p).name, s))
    return ModelSet(specs, specs[0].name, 0, None, None, lambda spec: 0)  # type: ignore[arg-type]


def speech_of(slot: SpeechSlot, ms: ModelSet | None) -> str:
    return asyncio.run(slot.model(ms))


def test_the_only_speech_model_served_is_found_from_its_files_once() -> None:
    looked: list[Path] = []

    def is_speech(path: Path) -> bool:
        looked.append(path)
        return "whisper" in path.name
    slot = SpeechSlot(is_speech=is_speech)
    ms = models("/m/smollm2", "/m/whisper-tiny.en", "/m/bge")
    assert speech_of(slot, ms) == "whisper-tiny.en"
    assert speech_of(slot, ms) == "whisper-tiny.en"
    assert len(looked) == 3       # each model's files looked at once


def test_the_setting_wins_and_none_or_several_are_refused_naming_model() -> None:
    assert speech_of(SpeechSlot("whisper-b", is_speech=lambda p: True), models("/m/whisper-a", "/m/whisper-b")) \
        == "whisper-b"
    with pytest.raises(NoSpeechModel, match="^model: several speech models are served .*server.speech_model"):
        speech_of(SpeechSlot(is_speech=lambda p: True), models("/m/whisper-a", "/m/whisper-b"))
    with pytest.raises(NoSpeechModel, match="^model: no speech model is served"):
        speech_of(SpeechSlot(is_speech=lambda p: False), models("/m/smollm2"))
    with pytest.raises(NoSpeechModel):
        speech_of(SpeechSlot(), None)


def test_server_speech_model_must_be_served(tmp_path: Path) -> None:
    s = Settings()
    s.models = [ModelEntry(path=str(tmp_path / "a.gguf")), ModelEntry(path=str(tmp_path / "whisper"), name="w")]
    s.server.speech_model = "w"
    assert [spec.name for spec in model_specs(s)[0]] == ["a", "w"]
    s.server.speech_model = "whisper-large"
    with pytest.raises(ConfigError, match="server.speech_model 'whisper-large' is not served"):
        model_specs(s)


def test_the_limits_are_settings_with_openais_upload_limit() -> None:
    s = Settings()
    assert (s.server.speech_model, s.server.max_audio_bytes, s.server.max_audio_seconds) == ("", 25 << 20, 600.0)
