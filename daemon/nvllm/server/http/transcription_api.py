"""POST /v1/audio/transcriptions and /v1/audio/translations, OpenAI's: the form read
(transcription_reader.py), handed in through DaemonState.submit as one engine request to the speech model
(server/transcribing.py), answered whole in the asked format or streamed (transcription_response.py), with
http/delivery.py's abort on a disconnect.

A request that names no model goes to the speech model (server.speech_model, or the only one served; 400
naming model when there is none); one naming a model that does not transcribe is refused by the engine,
naming model. The key, starting or draining, and the upload (413 naming file past server.max_audio_bytes,
400 naming the field) are checked before the model is leased, as app.py's generate checks its body.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import Response

from nvllm.engine.async_engine import EngineDead
from nvllm.server.http.delivery import event_stream, whole
from nvllm.server.http.errors import ApiError, bad_request
from nvllm.server.http.transcription_reader import read_transcription, read_upload
from nvllm.server.http.transcription_response import TranscriptAnswer
from nvllm.server.logs import request_context
from nvllm.server.models.model_set import UnknownModel
from nvllm.server.models.speech_slot import NoSpeechModel
from nvllm.server.state import DaemonState, Refused
from nvllm.server.transcribing import submit_transcription

_REFUSAL_REASON = {429: "busy", 503: "unavailable"}   # as app.py's: a refusal's status -> the metrics' reason


class TranscriptionApi:
    def __init__(self, state: DaemonState, check_key: Callable[[Request], None],
                 refusal: Callable[[Refused], ApiError], client_key: Callable[[Request], str]) -> None:
        """app.py's key check, its Refused -> ApiError mapping and its client key, so that both count alike."""
        self.state = state
        self.check_key = check_key
        self.refusal = refusal
        self.client_key = client_key

    async def transcriptions(self, request: Request) -> Response:
        return await self._run(request, "transcribe")

    async def translations(self, request: Request) -> Response:
        return await self._run(request, "translate")

    async def _run(self, request: Request, task: str) -> Response:
        t0, rid, st = time.monotonic(), uuid.uuid4().hex, self.state
        with request_context(rid):
            try:     # what is refused before the model is leased: the key, the phase, the upload
                self.check_key(request)
                st.check_serving()
                form = await read_upload(request, st.speech.max_audio_bytes)
                try:
                    ask = await read_transcription(form, task, st.speech.max_audio_bytes)
                finally:
                    await form.close()
                model = ask.model or await st.speech.model(st.models)
            except (ApiError, Refused, NoSpeechModel) as e:
                err = self.refusal(e) if isinstance(e, Refused) else \
                    bad_request("model", str(e)) if isinstance(e, NoSpeechModel) else e
                st.metrics.request("http", arrival=t0).refused(_REFUSAL_REASON.get(err.status, "invalid"))
                raise err from None
            try:
                sub = await submit_transcription(st, "http", self.client_key(request), rid, ask.audio, ask.params,
                                                 model, t0, ask.refusal, ask.priority, ask.keep_alive_s)
            except Refused as e:
                raise self.refusal(e) from None
            except UnknownModel as e:
                raise ApiError(404, str(e), "model", "model_not_found") from None
            except EngineDead as e:
                raise ApiError(503, str(e), code="unavailable") from None
            answer = TranscriptAnswer(ask, rid)
            if ask.stream:
                return event_stream(sub, answer, rid, t0)
            async with sub:
                done = await whole(request, sub, answer, rid)
            return answer.formatted() if done.status_code == 200 else done
