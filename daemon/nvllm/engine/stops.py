"""After sampling: a token appended to its sequence and the stops checked (EOS, the request's stop tokens and
stop strings, its grammar's end, the length), and the output a sequence hands back, holding back text that
could still turn out to be the start of a stop string. The step (llm_engine.py) finishes a sequence with the
reason `append_token` gives.
"""

from __future__ import annotations

import time

from nvllm.engine.outputs import RequestOutput, TokenLogprob
from nvllm.engine.sequence import Sequence, SequenceStatus


def append_token(seq: Sequence, token: int, lp: TokenLogprob | None, max_model_len: int) -> str | None:
    """Appends a sampled token (and its logprob) to seq and says why seq finishes with it ("stop", "length",
    "abort" where its grammar refuses the token) or None: the engine finishes it with that reason."""
    p = seq.params
    seq.token_ids.append(token)
    if lp is not None:
        seq.pending_logprobs.append(lp)
    matcher = seq.structured
    waiting = seq.structured_after_thinking
    if waiting is not None and token == waiting[0]:   # thinking ends: the grammar takes the next token on
        seq.structured, seq.structured_after_thinking = waiting[1], None
    if matcher is not None and not matcher.consume_token(token):
        # The mask allows only what the matcher takes: this is llguidance failing (e.g. a step over its
        # limits), reported with the request rather than sampled around.
        seq.error = f"structured output: token {token} refused ({matcher.get_error() or 'not allowed'})"
        return "abort"
    n_out = seq.num_output_tokens
    stop_token = n_out >= p.min_tokens   # below min_tokens no stop applies (vLLM's rule)
    if stop_token and token in seq.eos_token_ids and not p.ignore_eos:
        if p.include_stop_str_in_output:
            seq.detokenizer.add(token)
        return "stop"
    if stop_token and p.stop_token_ids and token in p.stop_token_ids:
        if p.include_stop_str_in_output:
            seq.detokenizer.add(token)
        seq.stop_reason = token
        return "stop"
    before = len(seq.text)
    seq.detokenizer.add(token)
    if p.stop and stop_token and _stop_string(seq, before):
        return "stop"
    if matcher is not None and matcher.is_stopped():   # the grammar is complete: nothing may follow
        return "stop"
    assert p.max_tokens is not None     # make_sequence set it
    if n_out >= p.max_tokens or seq.num_tokens >= max_model_len:
        return "length"
    return None


def _stop_string(seq: Sequence, before: int) -> bool:
    """Finds a stop string in text that ends in what this token added (matches may span tokens) and cuts the
    text there: seq then stops."""
    text = seq.text
    longest = max(len(s) for s in seq.params.stop)
    window_start = max(0, before - longest + 1)
    best: tuple[int, str] | None = None
    for s in seq.params.stop:
        i = text.find(s, window_start)
        if i != -1 and (best is None or i < best[0]):
            best = (i, s)
    if best is None:
        return False
    i, s = best
    seq.text_end = i + len(s) if seq.params.include_stop_str_in_output else i
    seq.stop_reason = s
    return True


def request_output(seq: Sequence) -> RequestOutput:
    """What seq hands back since its last output: new text (less what could still turn out to be the start of
    a stop string, until it finishes), token ids and logprobs, and at the end why it finished."""
    finished = seq.status is SequenceStatus.FINISHED
    text = seq.text
    end = len(text)
    if not finished and seq.params.stop:
        # Hold back what could still turn out to be the start of a stop string.
        end = max(seq.num_text_sent, end - (max(len(s) for s in seq.params.stop) - 1))
    text = text[seq.num_text_sent:end]
    seq.num_text_sent = end
    new_ids = seq.token_ids[seq.num_prompt_tokens + seq.num_tokens_sent:]
    seq.num_tokens_sent += len(new_ids)
    lps = None
    if seq.params.logprobs is not None:
        lps, seq.pending_logprobs = seq.pending_logprobs, []
    queued = prefill = None
    if new_ids and seq.num_tokens_sent == len(new_ids) and seq.scheduled_at is not None:   # its first tokens
        queued, prefill = seq.scheduled_at - seq.added_at, time.monotonic() - seq.scheduled_at
    return RequestOutput(
        request_id=seq.request_id, text=text, token_ids=new_ids, logprobs=lps, finished=finished,
        finish_reason=seq.finish_reason if finished else None, stop_reason=seq.stop_reason,
        prompt_tokens=seq.num_prompt_tokens, completion_tokens=seq.num_output_tokens,
        cached_tokens=seq.num_cached_tokens, error=seq.error, queued_s=queued, prefill_s=prefill,
        pooled=seq.pooled, dropped_prompt_tokens=seq.dropped_prompt_tokens)
