"""A new version of a served model put in service without an outage (`nvllm models reload NAME`, the gRPC
ReloadModel call, SIGHUP for every loaded model whose files changed).

The new version is the model's files as they are now (a bundle imported or a pull renamed a new file into
place, or the operator replaced it). For a loaded model:
1. Beside: when the memory budget holds its least (model_loader.least, read from the new files) beside what
   is held (idle models unloaded least recently used first to make room, as for any load), the new engine
   is loaded as the slot's candidate while the old one serves on.
2. Else in place: the old one drains (new requests wait for it, server.update_drain_s at most; past that the
   update fails and the old one serves on), is unloaded, and the new one loads in its place.
3. Checked: a short greedy generation (CHECK_TOKENS tokens, their logprobs finite) for a generator, an
   embedding (finite) for an embedder; for a reranker or a speech model, that it loaded.
4. Swapped (beside): new leases get the new engine; requests running on the old one finish on it, and it is
   unloaded once its last lease is given back (model_set.ModelSet.swap).
A version that fails to load or to answer is dropped: beside, the old one serves on untouched; in place, the
old one is already gone, so the model is left unloaded and its next request tries its files again. Either
way the reason is logged, kept for Health (the model's update_state and update_error) and counted in
/metrics (nvllm:model_updates_total by outcome). A model not loaded has nothing to swap: its next load reads
the new files (outcome "deferred"). Updates run one at a time.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
from dataclasses import dataclass

from nvllm.engine.async_engine import AsyncEngine, PendingRequest
from nvllm.engine.outputs import RequestOutput
from nvllm.pooling_params import PoolingParams
from nvllm.sampling_params import SamplingParams
from nvllm.server.models.file_signature import file_signature
from nvllm.server.models.model_set import LOADED, ModelSet, NoRoom, Slot

log = logging.getLogger("nvllm.server.models")

CHECK_PROMPT = "Hello"
CHECK_TOKENS = 4
CHECK_TIMEOUT_S = 120.0
# The outcomes, as Health's update_state and the metrics' outcome label say them.
SWAPPED, UNCHANGED, DEFERRED, FAILED = "swapped", "unchanged", "deferred", "failed"
OUTCOMES = (SWAPPED, UNCHANGED, DEFERRED, FAILED)


class CheckFailed(Exception):
    """A new version that loaded but did not answer as a model must."""


@dataclass(frozen=True)
class UpdateResult:
    model: str
    outcome: str          # one of OUTCOMES
    reason: str           # what was done, or why it failed


class ModelUpdates:
    def __init__(self, drain_s: float = 60.0, check_timeout_s: float = CHECK_TIMEOUT_S) -> None:
        """drain_s: server.update_drain_s, how long new requests may wait for the old version to drain when
        both versions do not fit."""
        self.drain_s = drain_s
        self.check_timeout_s = check_timeout_s
        self._one_at_a_time = asyncio.Lock()
        self._ids = itertools.count()

    async def reload(self, models: ModelSet, name: str, changed_only: bool = False) -> UpdateResult:
        """Put the named model's files as they are now in service (UnknownModel for a name not served).
        changed_only: nothing to do (UNCHANGED) when its files are those it was loaded from."""
        slot = models.resolve(name)
        async with self._one_at_a_time:
            while slot.transition is not None:      # a load or an unload under way: let it end first
                await asyncio.shield(slot.transition)
            if slot.phase != LOADED or slot.engine is None:
                return self._record(slot, DEFERRED, "not loaded: its next load reads its files as they are now")
            files = file_signature(slot.spec.settings.model_path())
            if changed_only and files == slot.files:
                return self._record(slot, UNCHANGED, "its files are those it was loaded from")
            slot.updating = True
            try:
                return await self._update(models, slot)
            finally:
                slot.updating = False

    async def reload_changed(self, models: ModelSet) -> list[UpdateResult]:
        """SIGHUP: every loaded model whose files changed since it was loaded, one after another."""
        out = []
        for slot in list(models.slots.values()):
            if slot.phase == LOADED and file_signature(slot.spec.settings.model_path()) != slot.files:
                out.append(await self.reload(models, slot.name, changed_only=True))
        if not out:
            log.info("SIGHUP: no loaded model's files changed")
        return out

    async def _update(self, models: ModelSet, slot: Slot) -> UpdateResult:
        path = slot.spec.settings.model_path()
        log.info("model %s: updating from %s", slot.name, path)
        try:
            slot.update.state = "loading"
            need = await asyncio.get_running_loop().run_in_executor(None, models.least, slot.spec)
            files = file_signature(path)
            if models.room_for(slot) >= need:
                try:
                    engine = await models.load_beside(slot, need)
                except NoRoom:      # taken meanwhile by another model's load: drain instead
                    pass
                else:
                    slot.update.state = "checking"
                    try:
                        await self.check(engine)
                    except BaseException:
                        await models.discard_candidate(slot)
                        raise
                    models.swap(slot, files)
                    return self._record(slot, SWAPPED, f"loaded beside the old version and checked; serving "
                                                       f"{path}")
            slot.update.state = "draining"
            log.info("model %s: the memory budget does not hold both versions: draining the old one first "
                     "(new requests wait, %g s at most)", slot.name, self.drain_s)
            await models.reload_in_place(slot, self.check, self.drain_s)
            return self._record(slot, SWAPPED, f"the old version drained and unloaded, the new one loaded and "
                                               f"checked; serving {path}")
        except Exception as e:
            why = f"{type(e).__name__}: {e}" if not str(e) else str(e)
            kept = "the old version serves on" if slot.engine is not None else \
                "the model is unloaded; its next request loads its files again"
            return self._record(slot, FAILED, f"{why} ({kept})")

    async def check(self, engine: AsyncEngine) -> None:
        """A generator's short greedy answer, an embedder's embedding: each must come back whole and finite;
        CheckFailed naming what did not."""
        task = engine.task
        if task == "generate":
            params: SamplingParams | PoolingParams = SamplingParams(temperature=0.0, max_tokens=CHECK_TOKENS,
                                                                    ignore_eos=True, logprobs=0)
        elif task == "embed":
            params = PoolingParams()
        else:       # a reranker needs a pair, a speech model audio: loading it is the check
            return
        rid = f"nvllm-update-check-{next(self._ids)}"
        try:
            pending = await asyncio.get_running_loop().run_in_executor(None, engine.prepare, rid, CHECK_PROMPT,
                                                                       params)
            outs = await asyncio.wait_for(self._outputs(engine, pending), self.check_timeout_s)
        except TimeoutError:
            raise CheckFailed(f"its check did not answer within {self.check_timeout_s:g} s") from None
        except CheckFailed:
            raise
        except Exception as e:
            raise CheckFailed(f"its check failed: {e}") from None
        last = outs[-1] if outs else None
        if last is None or not last.finished or last.error or last.finish_reason == "abort":
            raise CheckFailed(f"its check failed: {last.error if last is not None and last.error else 'no answer'}")
        if task == "embed":
            vector = last.pooled or []
            if not vector or not all(math.isfinite(v) for v in vector):
                raise CheckFailed("its check's embedding is empty or not finite")
            return
        tokens = [t for o in outs for t in o.token_ids]
        logprobs = [lp.logprob for o in outs for lp in (o.logprobs or [])]
        if len(tokens) != CHECK_TOKENS or not all(math.isfinite(v) for v in logprobs):
            raise CheckFailed(f"its check's greedy answer is not {CHECK_TOKENS} tokens of finite logprobs")

    @staticmethod
    async def _outputs(engine: AsyncEngine, pending: PendingRequest) -> list[RequestOutput]:
        return [out async for out in engine.generate(pending)]

    def _record(self, slot: Slot, outcome: str, reason: str) -> UpdateResult:
        u = slot.update
        u.state = outcome
        u.error = reason if outcome == FAILED else ""
        u.outcomes[outcome] = u.outcomes.get(outcome, 0) + 1
        if outcome == FAILED:
            log.warning("model %s: update failed: %s", slot.name, reason)
        else:
            log.info("model %s: update %s: %s", slot.name, outcome, reason)
        return UpdateResult(slot.name, outcome, reason)
