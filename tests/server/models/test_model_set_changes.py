"""The model set changed while serving (server/models/model_set.py): a model added is served by its name and
aliases, unloaded until its first lease; every name resolves with Ollama's ":latest" added or taken off; a
name or alias another model has is refused; removing a model unloads it and forgets its aliases, and is
refused for the default one, a pinned one and one with a request in flight; expires_in follows keep_alive.
And served_models reads a pulled model's aliases from its pull record."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nvllm.config import Settings
from nvllm.server.models.model_set import LOADED, UNLOADED, ModelBusy, ModelSpec, UnknownModel
from nvllm.server.models.served_models import model_specs, pull_record_path, pulled_spec
from server.models.test_model_set import Harness, run


def test_added_models_answer_by_name_alias_and_latest() -> None:
    h = Harness({"chat": 100, "embed": 50}, 1000, pinned=("embed",))
    m = h.models
    slot = m.add(ModelSpec("qwen", Settings(), 300.0, aliases=("hf.co/Qwen/Q-GGUF:Q4_K_M",)), ["Qwen/Q-GGUF:Q4_K_M"])
    assert slot.phase == UNLOADED and m.names == ["chat", "embed", "qwen"]
    for name in ("qwen", "qwen:latest", "hf.co/Qwen/Q-GGUF:Q4_K_M", "Qwen/Q-GGUF:Q4_K_M", "chat:latest"):
        assert m.resolve(name).name == name.split(":latest")[0].replace("hf.co/Qwen/Q-GGUF:Q4_K_M", "qwen") \
            .replace("Qwen/Q-GGUF:Q4_K_M", "qwen")
    assert m.aliases_of("qwen") == ["hf.co/Qwen/Q-GGUF:Q4_K_M", "Qwen/Q-GGUF:Q4_K_M"]
    with pytest.raises(UnknownModel):
        m.resolve("qwen:7b")
    with pytest.raises(ValueError, match="served already"):
        m.add(ModelSpec("chat", Settings()))
    with pytest.raises(ValueError, match="taken by the model 'qwen'"):
        m.add(ModelSpec("other", Settings()), ["Qwen/Q-GGUF:Q4_K_M"])

    async def go() -> Any:
        h.costs["qwen"] = 10
        lease = await m.lease("qwen:latest")
        assert lease.name == "qwen" and m.slots["qwen"].phase == LOADED
        with pytest.raises(ModelBusy) as busy:
            await m.remove("qwen")
        assert busy.value.in_flight
        lease.release()
        for name in ("chat", "embed"):
            with pytest.raises(ModelBusy) as refused:
                await m.remove(name)
            assert not refused.value.in_flight
        spec = await m.remove("Qwen/Q-GGUF:Q4_K_M")
        return spec
    spec = run(go())
    assert spec.name == "qwen" and h.unloads == ["qwen"] and m.names == ["chat", "embed"] and not m.aliases
    with pytest.raises(UnknownModel):
        m.resolve("hf.co/Qwen/Q-GGUF:Q4_K_M")
    m.add(ModelSpec("qwen", Settings()))          # pulled again: served again
    assert m.resolve("qwen").phase == UNLOADED


def test_expires_in_follows_keep_alive() -> None:
    h = Harness({"chat": 100, "embed": 50}, 1000, pinned=("embed",), keep_alive=60.0)

    async def go() -> None:
        lease = await h.models.lease("chat")
        assert h.models.expires_in(h.models.slots["chat"]) == 60.0      # busy: the whole keep_alive ahead
        lease.release()
    run(go())
    h.now += 20
    assert h.models.expires_in(h.models.slots["chat"]) == 40.0
    assert h.models.expires_in(h.models.slots["embed"]) is None        # pinned: never
    h.models.slots["chat"].keep_alive_s = -1
    assert h.models.expires_in(h.models.slots["chat"]) is None


def test_a_pull_record_gives_aliases_and_a_pulled_spec(tmp_path: Path, tiny_ggufs: dict[str, Path]) -> None:
    gguf = tmp_path / "pulled.gguf"
    gguf.write_bytes(tiny_ggufs["tiny-llama"].read_bytes())
    pull_record_path(gguf).write_text(json.dumps({"source": "hf.co/o/pulled:F32",
                                                  "aliases": ["hf.co/o/pulled:F32", "o/pulled:F32", "pulled"]}))
    folder = tmp_path / "folder-model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    s = Settings()
    s.model.serve_dir = str(tmp_path)
    specs, default = model_specs(s)
    by_name = {spec.name: spec for spec in specs}
    assert default == "folder-model" and set(by_name) == {"pulled", "folder-model"}
    assert by_name["pulled"].aliases == ("hf.co/o/pulled:F32", "o/pulled:F32")     # its own name is no alias
    spec = pulled_spec(s, "pulled", gguf, ["o/pulled:F32", "pulled"])
    assert spec.aliases == ("o/pulled:F32",) and not spec.pinned and spec.keep_alive_s == 300.0
    assert spec.settings.model_path() == gguf and spec.settings.speculative.method == "none"
