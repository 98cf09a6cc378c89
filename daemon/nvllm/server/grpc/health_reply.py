"""gRPC's Health answer (HealthResponse) shaped from the daemon's neutral Health (server/health.py)."""

from __future__ import annotations

from nvllm.server.health import DRAINING, NOT_ADMITTING, SERVING, STARTING, Health
from nvllm.v1 import nvllm_pb2 as pb

STATES = {STARTING: pb.HealthResponse.STATE_STARTING, SERVING: pb.HealthResponse.STATE_SERVING,
          NOT_ADMITTING: pb.HealthResponse.STATE_NOT_ADMITTING, DRAINING: pb.HealthResponse.STATE_DRAINING}
MODEL_STATES = {"unloaded": pb.ModelHealth.STATE_UNLOADED, "loading": pb.ModelHealth.STATE_LOADING,
                "loaded": pb.ModelHealth.STATE_LOADED, "unloading": pb.ModelHealth.STATE_UNLOADING}


def health_reply(h: Health) -> pb.HealthResponse:
    r = pb.HealthResponse(state=STATES[h.state], model=h.model, version=h.version, uptime_s=h.uptime_s,
                          startup_s=h.startup_s)
    if h.state == NOT_ADMITTING:
        r.not_admitting_reason = h.not_admitting_reason
    if h.engine is not None:
        s = h.engine
        r.pages_total, r.pages_free, r.pages_cached = s["pages_total"], s["pages_free"], s["pages_cached"]
        r.pages_backed = s["pages_backed"]
        r.kv_cache_dtype, r.page_bytes = s["kv_cache_dtype"], s["page_bytes"]
        r.running, r.waiting = s["running"], s["waiting"]
        r.tokens_per_s = float(s["tokens_per_s"])
    for m in h.models:
        mh = r.models.add(name=m["name"], state=MODEL_STATES[m["state"]], pinned=m["pinned"],
                          keep_alive_s=m["keep_alive_s"], bytes=m["bytes"], requests=m["requests"],
                          loads=m["loads"], max_model_len=m["max_model_len"] or 0, default=m["default"],
                          update_state=m.get("update_state", ""), update_error=m.get("update_error", ""),
                          retiring=m.get("retiring", 0))
        if m["stats"] is not None:
            s = m["stats"]
            mh.running, mh.waiting = s["running"], s["waiting"]
            mh.pages_total, mh.pages_free, mh.pages_cached = s["pages_total"], s["pages_free"], s["pages_cached"]
    r.memory_budget_bytes, r.memory_held_bytes = h.memory_budget_bytes, h.memory_held_bytes
    r.watchdog_low_bytes, r.watchdog_high_bytes = h.watchdog_low_bytes, h.watchdog_high_bytes
    if h.available_memory_bytes is not None:
        r.available_memory_bytes = h.available_memory_bytes
    r.thermal_throttled, r.throttle_reason = h.thermal_throttled, h.throttle_reason
    if h.cpu_temperature_celsius is not None:
        r.cpu_temperature_celsius = h.cpu_temperature_celsius
    return r
