"""A transcription's answer in OpenAI's shapes: whole, in one of the five response formats, or as server-sent
events while the engine makes it (transcript.text.delta each time a window's text is accepted, then
transcript.text.done with the whole text). Built from the outputs collected into server/transcribing.py's
Transcript; app.py's delivery (http/delivery.py) collects, streams and aborts on a disconnect, as for a chat.

json           {"text", "usage": {"type": "duration", "seconds"}} (a translation: {"text"})
text           the text and a newline
srt, vtt       the segments as subtitles (their times decoded: Whisper's timestamps)
verbose_json   {"task", "language" (its English name, as OpenAI's), "duration", "text", "segments": [...]}
"""

from __future__ import annotations

import json
import math
from typing import Any

from starlette.responses import JSONResponse, PlainTextResponse, Response

from nvllm.engine.outputs import RequestOutput, Segment
from nvllm.server.http.dialect import Event
from nvllm.server.http.errors import ApiError
from nvllm.server.http.transcription_reader import TranscriptionAsk
from nvllm.server.transcribing import Transcript, TranscriptionFailed

MIN_LOGPROB = -9999.0      # JSON has no -inf: an average logprob below this is sent as it (vLLM's floor too)

# Whisper's languages by code, in English, as OpenAI's verbose_json names them.
_NAMES = """en english,zh chinese,de german,es spanish,ru russian,ko korean,fr french,ja japanese,pt portuguese,
tr turkish,pl polish,ca catalan,nl dutch,ar arabic,sv swedish,it italian,id indonesian,hi hindi,fi finnish,
vi vietnamese,he hebrew,uk ukrainian,el greek,ms malay,cs czech,ro romanian,da danish,hu hungarian,ta tamil,
no norwegian,th thai,ur urdu,hr croatian,bg bulgarian,lt lithuanian,la latin,mi maori,ml malayalam,cy welsh,
sk slovak,te telugu,fa persian,lv latvian,bn bengali,sr serbian,az azerbaijani,sl slovenian,kn kannada,
et estonian,mk macedonian,br breton,eu basque,is icelandic,hy armenian,ne nepali,mn mongolian,bs bosnian,
kk kazakh,sq albanian,sw swahili,gl galician,mr marathi,pa punjabi,si sinhala,km khmer,sn shona,yo yoruba,
so somali,af afrikaans,oc occitan,ka georgian,be belarusian,tg tajik,sd sindhi,gu gujarati,am amharic,
yi yiddish,lo lao,uz uzbek,fo faroese,ht haitian creole,ps pashto,tk turkmen,nn nynorsk,mt maltese,
sa sanskrit,lb luxembourgish,my myanmar,bo tibetan,tl tagalog,mg malagasy,as assamese,tt tatar,haw hawaiian,
ln lingala,ha hausa,ba bashkir,jw javanese,su sundanese,yue cantonese"""
LANGUAGE_NAMES = dict(item.strip().split(" ", 1) for item in _NAMES.split(","))


def language_name(code: str | None) -> str:
    return LANGUAGE_NAMES.get(code or "", code or "")


def segment_dict(s: Segment) -> dict[str, Any]:
    """OpenAI's verbose_json segment."""
    return {"id": s.id, "seek": s.seek, "start": _finite(s.start), "end": _finite(s.end), "text": s.text,
            "tokens": list(s.tokens), "temperature": _finite(s.temperature),
            "avg_logprob": max(MIN_LOGPROB, _finite(s.avg_logprob, MIN_LOGPROB)),
            "compression_ratio": _finite(s.compression_ratio), "no_speech_prob": _finite(s.no_speech_prob)}


def _finite(x: float, instead: float = 0.0) -> float:
    return float(x) if math.isfinite(x) else instead


def _clock(seconds: float, mark: str) -> str:
    """HH:MM:SS<mark>mmm (srt's mark is a comma, vtt's a point)."""
    ms = max(0, round(seconds * 1000))
    return f"{ms // 3_600_000:02d}:{ms // 60_000 % 60:02d}:{ms // 1000 % 60:02d}{mark}{ms % 1000:03d}"


def srt(segments: list[Segment]) -> str:
    return "".join(f"{i}\n{_clock(s.start, ',')} --> {_clock(s.end, ',')}\n{s.text.strip()}\n\n"
                   for i, s in enumerate(segments, 1))


def vtt(segments: list[Segment]) -> str:
    return "WEBVTT\n\n" + "".join(f"{_clock(s.start, '.')} --> {_clock(s.end, '.')}\n{s.text.strip()}\n\n"
                                  for s in segments)


def formatted(t: Transcript, response_format: str, task: str = "transcribe") -> Response:
    """The whole answer in the asked format."""
    seconds = round(t.seconds or 0.0, 3)
    if response_format == "text":
        return PlainTextResponse(t.heard + "\n")
    if response_format == "srt":
        return PlainTextResponse(srt(t.segments))
    if response_format == "vtt":
        return PlainTextResponse(vtt(t.segments), media_type="text/vtt")
    if response_format == "verbose_json":
        body: dict[str, Any] = {"task": task, "language": "english" if task == "translate" else
                                language_name(t.language), "duration": seconds, "text": t.heard,
                                "segments": [segment_dict(s) for s in t.segments]}
        if task == "transcribe":
            body["usage"] = {"type": "duration", "seconds": seconds}
        return JSONResponse(body)
    if task == "translate":
        return JSONResponse({"text": t.heard})
    return JSONResponse({"text": t.heard, "usage": {"type": "duration", "seconds": seconds}})


class TranscriptAnswer:
    """One transcription's answer for http/delivery.py (the Answering protocol of dialect.py): the outputs
    collected into a Transcript, or each turned into the stream's events as it comes."""

    def __init__(self, ask: TranscriptionAsk, request_id: str) -> None:
        self.ask = ask
        self.request_id = request_id
        self.transcript = Transcript()

    def add(self, index: int, out: RequestOutput) -> None:
        self._take(out)

    def response(self) -> dict[str, Any]:
        return {}     # the answer is formatted() from the transcript: not always JSON

    def formatted(self) -> Response:
        response = formatted(self.transcript, self.ask.response_format, self.ask.task)
        response.headers["X-Request-Id"] = self.request_id
        return response

    def events(self, index: int, out: RequestOutput) -> list[Event]:
        delta = self._take(out)
        return [_event({"type": "transcript.text.delta", "delta": delta})] if delta else []

    def closing(self) -> list[Event]:
        t = self.transcript
        usage = {"type": "tokens", "input_tokens": t.prompt_tokens, "output_tokens": t.completion_tokens,
                 "total_tokens": t.prompt_tokens + t.completion_tokens}
        return [_event({"type": "transcript.text.done", "text": t.heard, "usage": usage})]

    def failed(self, e: ApiError) -> Event:
        return {"event": "error", "data": json.dumps(e.body())}

    def token_counts(self) -> tuple[int, int]:
        return self.transcript.prompt_tokens, self.transcript.completion_tokens

    def _take(self, out: RequestOutput) -> str:
        try:
            return self.transcript.add(out)
        except TranscriptionFailed as e:   # delivery.py checks failures first; this is for safety's sake
            raise ApiError(503 if e.aborted else 500, str(e), code="unavailable" if e.aborted
                           else "engine_error") from None


def _event(data: dict[str, Any]) -> Event:
    return {"event": data["type"], "data": json.dumps(data, ensure_ascii=False)}
