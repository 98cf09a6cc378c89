"""Models pulled and deleted while the daemon serves (Ollama's /api/pull and /api/delete).

A pull runs the injected `Puller` (cli/serve.py wires the Hugging Face Hub's, nvllm.model_files.hub: server/
never imports model_files) on a thread, its progress lines handed to the caller on the event loop as they
come; the model it leaves in the daemon's models directory (served_models.models_dir: model.serve_dir, else
model.models_dir) is then served by its name and aliases, unloaded, loaded on its first request within the
memory plan as any model. A reference that already names a served model is done at once. Pulls run one at
a time (a second waits: two pulls of one model must not write the same files).

A delete stops serving the model (model_set.ModelSet.remove: never the default one, a pinned one, or one
with requests in flight) and removes its files and pull record only where they lie inside the models
directory: a model the operator named elsewhere stays on disk.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nvllm.config import Settings
from nvllm.server.models.model_set import ModelSet, ModelSpec, UnknownModel
from nvllm.server.models.served_models import models_dir, pull_record_path, pulled_spec

log = logging.getLogger("nvllm.server.models")

Progress = Callable[[dict[str, Any]], None]
# (reference, progress) -> (served name, the .gguf file or folder, aliases); raises with a one-line message
Puller = Callable[[str, Progress], tuple[str, Path, list[str]]]


class PullFailed(Exception):
    """A pull that did not leave a model to serve: the puller's own error, or none wired."""


class ModelPulls:
    def __init__(self, settings: Settings, puller: Puller | None) -> None:
        self.settings = settings
        self.puller = puller
        self.dir = models_dir(settings)
        self._one_at_a_time = asyncio.Lock()

    async def pull(self, models: ModelSet, ref: str, progress: Progress) -> str:
        """Pull ref and serve it; the served name. progress(line) on the event loop, Ollama's pull-stream
        shape, the last one {"status": "success"}. PullFailed naming the cause."""
        try:
            name = models.resolve(ref).name
        except UnknownModel:
            name = ""
        if name:
            progress({"status": "success"})
            return name
        if self.puller is None:
            raise PullFailed("this daemon pulls no models (nvllm serve wires no puller)")
        loop = asyncio.get_running_loop()

        def from_thread(line: dict[str, Any]) -> None:
            if line.get("status") != "success":     # the pull's own: success is once the model is served
                loop.call_soon_threadsafe(progress, dict(line))
        async with self._one_at_a_time:
            try:
                name = models.resolve(ref).name      # pulled meanwhile by the pull this one waited for
            except UnknownModel:
                name = ""
            if name:
                progress({"status": "success"})
                return name
            puller = self.puller
            try:
                name, path, aliases = await loop.run_in_executor(None, lambda: puller(ref, from_thread))
            except Exception as e:      # the puller's errors name their cause in one line
                log.warning("pull of %r failed: %s", ref, e)
                raise PullFailed(str(e) or type(e).__name__) from None
            await asyncio.sleep(0)      # the progress lines the thread queued go first
            try:
                models.add(pulled_spec(self.settings, name, Path(path), [ref, *aliases]))
            except ValueError as e:
                raise PullFailed(f"pulled {ref!r} but cannot serve it: {e}") from None
        log.info("pulled %r: serving it as %s", ref, name)
        progress({"status": "success"})
        return name

    async def delete(self, models: ModelSet, name: str) -> tuple[str, bool]:
        """Stop serving the named model and delete its files where they lie inside the models directory:
        (its served name, whether files were deleted). UnknownModel, ModelBusy (model_set.py)."""
        spec = await models.remove(name)
        return spec.name, self._delete_files(spec)

    def _delete_files(self, spec: ModelSpec) -> bool:
        path = spec.settings.model_path()
        try:     # the entry itself in the folder (a link there is removed, not what it points to)
            inside = path.parent.resolve() == self.dir.resolve() and not path.name.startswith(".")
        except OSError:
            inside = False
        if not inside or not (path.exists() or path.is_symlink()):
            log.info("model %s no longer served; its files at %s are kept (outside %s)", spec.name, path, self.dir)
            return False
        record = pull_record_path(path)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
            record.unlink(missing_ok=True)
        log.info("model %s deleted: %s", spec.name, path)
        return True
