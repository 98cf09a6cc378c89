"""Prometheus metrics, named like vLLM's so its dashboards fit, plus nvllm's own where vLLM has none.

One `Metrics` per daemon (`DaemonState.metrics`), with its own CollectorRegistry (never the process-wide
default, so a process may hold several daemons' metrics, as the tests do). Every series carries the
label model_name, as vLLM's do. Three sources feed it:

- The engine's stats snapshot (`AsyncEngine.stats()`: running, waiting, pages, prefix-cache tokens,
  preemptions) and the daemon's state (admission, the memory watchdog's last reading, the board's heat:
  server/board/heat_monitor.py) are read at
  scrape time by a collector: nothing is copied on the engine thread, and a scrape never waits for it.
- Each engine step: the daemon builds `AsyncEngine(..., on_step=metrics.observe_step)`, called on the
  engine thread with the step's wall time and tokens.
- Each request, observed on its way through `DaemonState.submit` (server/state.py), which makes one tracker
  per engine request, and its `Submission` (server/submission.py), which feeds it every output:

      track = state.metrics.request("http", arrival=t0)   # t0 = time.monotonic() on arrival
      track.refused("invalid")         # or "busy" (429 / RESOURCE_EXHAUSTED), "unavailable" (503 /
                                       # UNAVAILABLE); before admission only
      track.admitted(prompt_tokens)    # the engine took it
      track.output(out)                # every RequestOutput, in order, before anything else sees it
      track.close()                    # the front door is done with it

  The tracker turns those into time to first token (and its parts: the engine's queue, prefill, as the
  engine timed them on the output with the first tokens; then the first decode step), inter-token
  latency, end-to-end latency, token counts and the finish reason. A request closed before its final
  output (the client left, a deadline passed) counts as finished with reason "abort". A front door
  counts only what it refuses itself (a body it cannot read), with
  `state.metrics.request(api, t0).refused("invalid")`.

`exposition()` gives (body, content type) for an HTTP response at /metrics; the metrics-only
listener (server/metrics_listener.py) serves the same when the HTTP API is off. It is always
Prometheus' text format 0.0.4, whatever the scraper's Accept header asks: prometheus_client 0.26's
OpenMetrics output turns the colon of a name into "_" in the samples but not in HELP/TYPE (its issue
1177), so a Prometheus that prefers OpenMetrics (3.x does) would store vllm_* series that no vLLM
dashboard queries. Every Prometheus reads 0.0.4, which keeps the names as they are.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.registry import Collector

from nvllm.engine.outputs import RequestOutput

APIS = ("grpc", "http")
REFUSALS = ("invalid", "busy", "unavailable")
FINISH_REASONS = ("stop", "length", "abort")
# What admission is doing, one series each (1 for the current state): a Prometheus "enum".
ADMISSION_STATES = ("starting", "serving", "memory_pressure", "engine_stopped", "draining")
MODEL_STATES = ("unloaded", "loading", "loaded", "unloading")    # server/models/model_set.py's
LABEL = "model_name"

# Buckets for a CPU on a small board: a step takes milliseconds to a second, a long prompt's first
# token tens of seconds.
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 600.0)
ITL_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 0.6, 1.0, 2.0, 5.0, 10.0)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 600.0, 1800.0, 3600.0)
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
STEP_TOKEN_BUCKETS = tuple(float(2 ** i) for i in range(14))                   # 1 .. 8192
TOKEN_BUCKETS = tuple(float(m * 10 ** e) for e in range(6) for m in (1, 2, 5))   # 1 .. 500000


class Metrics:
    """The daemon's metrics. `state` is the DaemonState (its models, phase and watchdog are read at
    scrape time); None serves the per-request and per-step metrics alone. The request and step metrics
    are kept per model (`for_model`), labelled model_name as vLLM's are."""

    def __init__(self, model_name: str, state: Any = None) -> None:
        self.model_name = model_name
        # The *_created series would double the exposition and no dashboard reads them. The switch is
        # process-wide: prometheus_client serves nothing else in the daemon.
        disable_created_metrics()
        self.registry = CollectorRegistry()
        reg, m = self.registry, [LABEL]

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, m + list(labels), registry=reg)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, m, buckets=buckets, registry=reg)

        self.families: dict[str, Counter | Histogram] = {
            "ttft": histogram("vllm:time_to_first_token_seconds",
                              "Time from a request's arrival to its first token, in seconds.", TTFT_BUCKETS),
            # the time to first token's parts: waiting in the engine's queue, then prefill (what the prefix
            # cache did not hold) to the first token; then the first decode step's token
            "queue_time": histogram("vllm:request_queue_time_seconds", "Time a request waited in the engine's "
                                    "queue before its first step, in seconds.", TTFT_BUCKETS),
            "prefill_time": histogram("vllm:request_prefill_time_seconds", "Time from a request's first step to "
                                      "its first token (its prefill), in seconds.", TTFT_BUCKETS),
            "first_decode": histogram("nvllm:request_first_decode_seconds", "Time from a request's first token "
                                      "to its second (its first decode step), in seconds.", ITL_BUCKETS),
            "itl": histogram("vllm:inter_token_latency_seconds",
                             "Time between a request's successive tokens, in seconds.", ITL_BUCKETS),
            "e2e": histogram("vllm:e2e_request_latency_seconds",
                             "Time from a request's arrival to its end, in seconds.", E2E_BUCKETS),
            "request_prompt_tokens": histogram("vllm:request_prompt_tokens",
                                               "Prompt tokens of each finished request.", TOKEN_BUCKETS),
            "request_generation_tokens": histogram("vllm:request_generation_tokens",
                                                   "Generated tokens of each finished request.", TOKEN_BUCKETS),
            "prompt_tokens": counter("vllm:prompt_tokens", "Prompt tokens of the requests that got a first "
                                     "token (cached ones included)."),
            "generation_tokens": counter("vllm:generation_tokens", "Tokens generated and handed to clients."),
            "success": counter("vllm:request_success", "Requests finished, by finish reason.",
                               ("finished_reason",)),
            "requests": counter("nvllm:requests", "Requests handed to the engine, by front door.", ("api",)),
            "refused": counter("nvllm:requests_refused", "Requests refused before the engine, by front door and "
                               "reason: invalid (400, INVALID_ARGUMENT, 404 NOT_FOUND), busy (429, "
                               "RESOURCE_EXHAUSTED: load, memory pressure, the per-client cap, no room for the "
                               "model), unavailable (503, UNAVAILABLE: starting, draining).", ("api", "reason")),
            "step_seconds": histogram("nvllm:engine_step_seconds",
                                      "Wall time of each engine step that ran a batch, in seconds.", STEP_BUCKETS),
            "step_tokens": histogram("vllm:iteration_tokens_total",
                                     "Tokens (prompt chunks and decodes) computed by each engine step.",
                                     STEP_TOKEN_BUCKETS),
        }
        # Requests an upstream answered or failed ([[upstreams]], server/upstream/), by why they went there.
        self.forwarded_requests = Counter(
            "nvllm:forwarded_requests", "Requests forwarded to an upstream instead of refused here, by upstream, "
            "reason (not_served, too_long, no_room, busy, hot) and outcome (answered; failed: refused here, or "
            "answered here when hot).", ["upstream", "reason", "outcome"], registry=reg)
        self._models: dict[str, ModelMetrics] = {}
        self.for_model(model_name)
        reg.register(StateCollector(model_name, state))
        ProcessCollector(registry=reg)      # process_resident_memory_bytes, process_cpu_seconds_total, ...
        GCCollector(registry=reg)
        PlatformCollector(registry=reg)

    def for_model(self, name: str | None) -> ModelMetrics:
        """The request and step metrics of one model (None: the default one)."""
        name = name or self.model_name
        if name not in self._models:
            self._models[name] = ModelMetrics(self.families, name)
        return self._models[name]

    def request(self, api: str, arrival: float | None = None, model: str | None = None) -> RequestTracker:
        """A tracker for one request to `model` (None: the default) that arrived (time.monotonic()) at
        `arrival`, default now."""
        if api not in APIS:
            raise ValueError(f"api must be one of {', '.join(APIS)}, got {api!r}")
        return RequestTracker(self.for_model(model), api, time.monotonic() if arrival is None else arrival)

    def forwarded(self, upstream: str, reason: str, outcome: str) -> None:
        """A request forwarded to an upstream (server/upstream/forwarder.py)."""
        self.forwarded_requests.labels(upstream, reason, outcome).inc()

    def observe_step(self, seconds: float, tokens: int, model: str | None = None) -> None:
        """One engine step (AsyncEngine's on_step; thread-safe)."""
        self.for_model(model).observe_step(seconds, tokens)

    def exposition(self) -> tuple[bytes, str]:
        """The body and content type of a /metrics response: text format 0.0.4 (see the module's
        docstring for why never OpenMetrics)."""
        return generate_latest(self.registry), CONTENT_TYPE_PLAIN_0_0_4


class ModelMetrics:
    """One model's children of the request and step families."""

    def __init__(self, families: dict[str, Any], name: str) -> None:
        f = families
        self.ttft, self.queue_time, self.prefill_time = (f[k].labels(name) for k in ("ttft", "queue_time",
                                                                                     "prefill_time"))
        self.first_decode, self.itl, self.e2e = (f[k].labels(name) for k in ("first_decode", "itl", "e2e"))
        self.request_prompt_tokens = f["request_prompt_tokens"].labels(name)
        self.request_generation_tokens = f["request_generation_tokens"].labels(name)
        self.prompt_tokens = f["prompt_tokens"].labels(name)
        self.generation_tokens = f["generation_tokens"].labels(name)
        self.success = {r: f["success"].labels(name, r) for r in FINISH_REASONS}
        self.requests = {a: f["requests"].labels(name, a) for a in APIS}
        self.refused = {(a, r): f["refused"].labels(name, a, r) for a in APIS for r in REFUSALS}
        self.step_seconds, self.step_tokens = f["step_seconds"].labels(name), f["step_tokens"].labels(name)

    def observe_step(self, seconds: float, tokens: int) -> None:
        self.step_seconds.observe(seconds)
        self.step_tokens.observe(tokens)


class RequestTracker:
    """One request's metrics, fed by its front door on the event loop (see the module's docstring)."""

    def __init__(self, metrics: ModelMetrics, api: str, arrival: float) -> None:
        self.metrics = metrics
        self.api = api
        self.arrival = arrival
        self.is_admitted = False
        self.is_refused = False
        self.is_finished = False
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self._last_token: float | None = None

    def refused(self, reason: str) -> None:
        """Turned away before the engine took it; ignored once admitted (a refusal is counted once)."""
        if reason not in REFUSALS:
            raise ValueError(f"reason must be one of {', '.join(REFUSALS)}, got {reason!r}")
        if not (self.is_admitted or self.is_refused):
            self.is_refused = True
            self.metrics.refused[self.api, reason].inc()

    def admitted(self, prompt_tokens: int) -> None:
        """The engine took the request (AsyncEngine.add returned)."""
        if not self.is_admitted:
            self.is_admitted = True
            self.prompt_tokens = prompt_tokens
            self.metrics.requests[self.api].inc()

    def output(self, out: RequestOutput) -> None:
        """One of the request's outputs, as the front door receives it."""
        if self.is_finished:
            return
        m = self.metrics
        now = time.monotonic()
        n = len(out.token_ids)
        if out.prompt_tokens:
            self.prompt_tokens = out.prompt_tokens
        if out.queued_s is not None and out.prefill_s is not None:   # the output with its first tokens
            m.queue_time.observe(out.queued_s)
            m.prefill_time.observe(out.prefill_s)
        if n:
            if self._last_token is None:
                m.ttft.observe(now - self.arrival)
                m.prompt_tokens.inc(self.prompt_tokens)
            else:
                # One step gives a request one token, so the gap between outputs is the token's latency.
                m.itl.observe((now - self._last_token) / n)
                if self.generated_tokens == 1:
                    m.first_decode.observe(now - self._last_token)
            self._last_token = now
            self.generated_tokens += n
            m.generation_tokens.inc(n)
        if out.finished:
            self._finish(out.finish_reason or "abort", now)

    def close(self) -> None:
        """The front door is done with the request: one admitted but not finished counts as aborted."""
        if self.is_admitted and not self.is_finished:
            self._finish("abort", time.monotonic())

    def _finish(self, reason: str, now: float) -> None:
        self.is_finished = True
        m = self.metrics
        m.success.get(reason, m.success["abort"]).inc()
        m.e2e.observe(now - self.arrival)
        m.request_prompt_tokens.observe(self.prompt_tokens)
        m.request_generation_tokens.observe(self.generated_tokens)

    def __enter__(self) -> RequestTracker:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class StateCollector(Collector):
    """At scrape time: the engine's stats snapshot, admission, the memory watchdog's reading, the heat."""

    def __init__(self, model_name: str, state: Any) -> None:
        self.model_name = model_name
        self.state = state

    def describe(self) -> Iterable[Metric]:
        return list(_state_families().values())

    def collect(self) -> Iterator[Metric]:
        st = self.state
        if st is None:
            return
        watchdog = st.watchdog
        families = _state_families()
        name = [self.model_name]

        def put(key: str, value: float, labels: tuple[str, ...] = (), model: str | None = None) -> None:
            families[key].add_metric(([model] if model is not None else name) + list(labels), value)

        state = admission_state(st)
        put("nvllm:admission_open", 1.0 if state == "serving" else 0.0)
        for s in ADMISSION_STATES:
            put("nvllm:admission_state", 1.0 if s == state else 0.0, (s,))
        for m in st.model_status():
            model = m["name"]
            put("nvllm:model_loaded", 1.0 if m["state"] == "loaded" else 0.0, model=model)
            for phase in MODEL_STATES:
                put("nvllm:model_state", 1.0 if m["state"] == phase else 0.0, (phase,), model=model)
            put("nvllm:model_memory_bytes", m["bytes"], model=model)
            put("nvllm:model_loads", m["loads"], model=model)
            for outcome, n in m.get("updates", {}).items():
                put("nvllm:model_updates", n, (outcome,), model=model)
            if m["stats"] is not None:
                _engine_stats(m["stats"], lambda key, v, labels=(), model=model: put(key, v, labels, model))
        if st.models is not None:
            put("nvllm:memory_budget_bytes", st.models.budget_bytes)
            put("nvllm:memory_held_bytes", st.models.used_bytes())
        if watchdog is not None:
            put("nvllm:memory_low_watermark_bytes", watchdog.low_bytes)
            put("nvllm:memory_high_watermark_bytes", watchdog.high_bytes)
            reading = watchdog.last_reading
            if reading is not None:
                put("nvllm:memory_available_bytes", reading.available_bytes)
        heat = getattr(st, "heat", None)   # None: power.enabled is off
        if heat is not None:
            put("nvllm:thermal_throttled", 1.0 if heat.throttled else 0.0)
            if heat.cpu_celsius is not None:
                put("nvllm:cpu_temperature_celsius", heat.cpu_celsius)
        yield from (f for f in families.values() if f.samples)


def _engine_stats(s: dict[str, Any], put: Callable[..., None]) -> None:
    """One loaded model's engine stats snapshot as its gauges and counters."""
    put("vllm:num_requests_running", s["running"])
    put("vllm:num_requests_waiting", s["waiting"])
    put("vllm:kv_cache_usage_perc", s["pages_used"] / max(1, s["pages_total"]))
    put("nvllm:kv_cache_pool_pages", s["pages_total"], ("total",))
    put("nvllm:kv_cache_pool_pages", s["pages_backed"], ("backed",))
    put("nvllm:kv_cache_pages", s["pages_free"], ("free",))
    put("nvllm:kv_cache_pages", s["pages_cached"], ("cached",))
    put("nvllm:kv_cache_pages", s["pages_used"], ("used",))
    put("nvllm:kv_cache_page_bytes", s["page_bytes"])
    put("vllm:cache_config_info", 1.0, (str(s["block_size"]), s["kv_cache_dtype"], str(s["pages_total"])))
    put("vllm:prefix_cache_queries", s["prefix_cache_query_tokens"])
    put("vllm:prefix_cache_hits", s["prefix_cache_hit_tokens"])
    put("nvllm:prefix_cache_hit_rate", s["prefix_cache_hit_rate"])
    put("vllm:num_preemptions", s["preemptions"])
    put("nvllm:generation_tokens_per_second", s["tokens_per_s"])
    if s.get("spec_num_tokens"):   # speculating: vLLM's counters, and the rate by method
        put("vllm:spec_decode_num_drafts", s["spec_drafts"])
        put("vllm:spec_decode_num_draft_tokens", s["spec_draft_tokens"])
        put("vllm:spec_decode_num_accepted_tokens", s["spec_accepted_tokens"])
        for pos, n in enumerate(s["spec_accepted_per_position"]):
            put("vllm:spec_decode_num_accepted_tokens_per_pos", n, (str(pos),))
        put("nvllm:spec_decode_acceptance_rate", s["spec_acceptance_rate"], (s["spec_method"],))


def _state_families() -> dict[str, GaugeMetricFamily | CounterMetricFamily]:
    """Every family StateCollector yields, empty, by name."""
    g, c, m = GaugeMetricFamily, CounterMetricFamily, [LABEL]
    specs: list[tuple[type[GaugeMetricFamily | CounterMetricFamily], str, str, list[str]]] = [
        (g, "nvllm:admission_open", "1 while new requests are admitted, else 0 (nvllm:admission_state says "
                                    "why).", m),
        (g, "nvllm:admission_state", "1 for the daemon's admission state, 0 for the others.", m + ["state"]),
        (g, "vllm:num_requests_running", "Requests in the running batch.", m),
        (g, "vllm:num_requests_waiting", "Requests waiting for a seat in the batch.", m),
        (g, "vllm:kv_cache_usage_perc", "Share of the KV-cache pages held by requests (1 is all).", m),
        (g, "nvllm:kv_cache_pages", "KV-cache pages: free, cached (a reusable prefix, evictable) or used "
                                    "(held by requests).", m + ["state"]),
        (g, "nvllm:kv_cache_pool_pages", "KV-cache pool size in pages: total, and backed (resident, the only "
                                         "ones handed out; below total while the pool is backed after "
                                         "start-up).", m + ["size"]),
        (g, "nvllm:kv_cache_page_bytes", "Bytes of one KV-cache page: the keys and values of block_size "
                                         "tokens of every layer (of one group of layers, where sliding "
                                         "and global layers have pages of their own), in the cache's "
                                         "dtype.", m),
        (g, "vllm:cache_config_info", "The KV cache's configuration, in labels (always 1).",
         m + ["block_size", "cache_dtype", "num_gpu_blocks"]),
        (c, "vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", m),
        (c, "vllm:prefix_cache_hits", "Prompt tokens served from the prefix cache.", m),
        (g, "nvllm:prefix_cache_hit_rate", "Prefix-cache hits over queries, in tokens, since start.", m),
        (c, "vllm:num_preemptions", "Requests preempted (pages freed, recomputed later).", m),
        (g, "nvllm:generation_tokens_per_second", "Tokens generated per second over the last 10 s.", m),
        (c, "vllm:spec_decode_num_drafts", "Speculative proposals verified (one per sequence and step).", m),
        (c, "vllm:spec_decode_num_draft_tokens", "Tokens proposed by speculative decoding.", m),
        (c, "vllm:spec_decode_num_accepted_tokens", "Proposed tokens the target model accepted.", m),
        (c, "vllm:spec_decode_num_accepted_tokens_per_pos", "Proposed tokens accepted, by their position in "
                                                            "the proposal.", m + ["position"]),
        (g, "nvllm:spec_decode_acceptance_rate", "Accepted over proposed tokens since start, by proposal "
                                                 "method.", m + ["method"]),
        (g, "nvllm:memory_available_bytes", "Available memory at the watchdog's last reading.", m),
        (g, "nvllm:memory_low_watermark_bytes", "Below this available memory, admission stops.", m),
        (g, "nvllm:memory_high_watermark_bytes", "Above this available memory, admission resumes.", m),
        (g, "nvllm:model_loaded", "1 while the model is loaded (its weights and page pool in memory), else 0.", m),
        (g, "nvllm:model_state", "1 for the model's state: unloaded, loading, loaded or unloading.", m + ["state"]),
        (g, "nvllm:model_memory_bytes", "What the model holds of the memory budget: weights and page pool.", m),
        (c, "nvllm:model_loads", "Times the model was loaded since start.", m),
        (c, "nvllm:model_updates", "Updates of the model in place (nvllm models reload, SIGHUP) by outcome: "
                                   "swapped, unchanged, deferred (not loaded), failed (the old version serves on; "
                                   "Health's update_error says why).", m + ["outcome"]),
        (g, "nvllm:memory_budget_bytes", "The memory budget every model's weights and page pool share.", m),
        (g, "nvllm:memory_held_bytes", "What the loaded models hold of the memory budget.", m),
        (g, "nvllm:thermal_throttled", "1 while the board is hot and the daemon holds back (fewer matmul "
                                       "threads, a smaller step budget), else 0.", m),
        (g, "nvllm:cpu_temperature_celsius", "The hottest CPU thermal zone at the last reading.", m),
    ]
    return {name: cls(name, doc, labels=labels) for cls, name, doc, labels in specs}


def admission_state(state: Any) -> str:
    """One of ADMISSION_STATES for a DaemonState (its phase's value, its engine and watchdog)."""
    phase = state.phase.value
    if phase in ("starting", "draining"):
        return phase
    if state.not_admitting_reason().startswith("the engine loop"):
        return "engine_stopped"
    if state.watchdog is not None and not state.watchdog.admitting:
        return "memory_pressure"
    return "serving"
