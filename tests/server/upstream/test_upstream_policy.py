"""[[upstreams]] read and checked, routes chosen by model and reason, the refusals an upstream may answer told
apart precisely (a ContextOverflow, never a message's words), and a Generate request said in OpenAI's words."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from nvllm.config import load_settings
from nvllm.config_upstreams import UpstreamEntry
from nvllm.config_values import ConfigError
from nvllm.engine.prompt import ContextOverflow
from nvllm.sampling_params import InvalidParameter
from nvllm.server.grpc.forward_generate import forwardable, openai_body
from nvllm.server.models.model_set import UnknownModel
from nvllm.server.state import Refused
from nvllm.server.upstream.forwarder import Forwarder, mark_event
from nvllm.server.upstream.upstream_policy import UpstreamRoutes, upstream_from
from nvllm.v1 import nvllm_pb2 as pb


def settings(tmp_path: Path, text: str):
    (tmp_path / "c.toml").write_text(text)
    return load_settings(tmp_path / "c.toml")


def test_no_upstreams_by_default() -> None:
    assert load_settings().upstreams == []


def test_an_upstream_table_read_with_its_defaults_and_a_models_policy(tmp_path: Path) -> None:
    (tmp_path / "key").write_text("sekrit\nignored\n")
    s = settings(tmp_path, f"""
[[upstreams]]
name = "ws"
base_url = "http://10.0.0.2:8000/v1/"
api_key_file = "{tmp_path / 'key'}"
[[upstreams.policy]]
model = "qwen"
forward_when = ["hot"]
[[upstreams]]
name = "other"
base_url = "https://x.example:8443"
models = ["big"]
forward_when = ["not_served"]
timeout_s = 2.5
""")
    ws, other = (upstream_from(u) for u in s.upstreams)
    assert (ws.base_url, ws.api_key, ws.models, ws.timeout_s) == ("http://10.0.0.2:8000", "sekrit", ("*",), 10.0)
    assert ws.url("/v1/completions") == "http://10.0.0.2:8000/v1/completions"
    assert ws.forward_when == {"not_served", "too_long", "no_room", "busy"}
    routes = UpstreamRoutes([ws, other])
    assert routes.route(["qwen"], "hot") is ws and routes.route(["qwen"], "busy") is None   # its own policy
    assert routes.route(["llama"], "hot") is None and routes.route(["llama"], "busy") is ws
    assert routes.route(["big"], "not_served") is ws              # the first that serves it
    assert UpstreamRoutes([other]).route(["nope", "big"], "not_served") is other    # an alias's served name
    assert UpstreamRoutes([other]).route(["big"], "busy") is None
    assert not UpstreamRoutes([])


@pytest.mark.parametrize("table, says", [
    ('name = "a"\nbase_url = "10.0.0.2:8000"', "must start with http:// or https://"),
    ('name = "a"\nbase_url = "http://h"\nforward_when = ["always"]', '"always" is not one of'),
    ('name = "a"\nbase_url = "http://h"\napi_key = "k"\napi_key_file = "f"', "not both"),
    ('name = "a"\nbase_url = "http://h"\ntimeout_s = 0', "timeout_s must be"),
    ('base_url = "http://h"', "name must be"),
    ('name = "a"\nbase_url = "http://h"\n[[upstreams.policy]]\nmodel = "m"\nforward_when = ["x"]',
     "policy[0].forward_when"),
])
def test_a_bad_upstream_table_is_refused_naming_it(tmp_path: Path, table: str, says: str) -> None:
    with pytest.raises(ConfigError, match="upstreams") as e:
        settings(tmp_path, "[[upstreams]]\n" + table + "\n")
    assert says in str(e.value)


def test_two_upstreams_of_one_name_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="share a name"):
        settings(tmp_path, '[[upstreams]]\nname = "a"\nbase_url = "http://h"\n'
                           '[[upstreams]]\nname = "a"\nbase_url = "http://g"\n')


def test_the_refusals_an_upstream_may_answer() -> None:
    reason = Forwarder.reason
    assert reason(UnknownModel("x", ["y"])) == "not_served"
    assert reason(Refused("no room", busy=True, no_room=True)) == "no_room"
    assert reason(Refused("queue full", busy=True)) == "busy"
    assert reason(Refused("too many streams", busy=True, per_client=True)) is None    # the client's own cap
    assert reason(Refused("draining", busy=False)) is None
    too_long = ContextOverflow("prompt", "99 tokens", "shorter than max_model_len 48 tokens")
    assert reason(ValueError("the front door's 400"), too_long) == "too_long"
    assert reason(ValueError("400"), InvalidParameter("temperature", -1, "at least 0")) is None


def test_only_the_models_own_context_is_a_context_overflow() -> None:
    from nvllm.engine.prompt import generation_ids
    from nvllm.sampling_params import SamplingParams

    class Words:
        def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
            return [1] * len(text.split())
    for limit, kind in ((None, ContextOverflow), (4, InvalidParameter)):
        params = SamplingParams(max_tokens=2)
        params.context_limit = limit
        with pytest.raises(InvalidParameter) as e:
            generation_ids(Words(), 100, [1] * 30, params, 16)    # type: ignore[arg-type]
        assert isinstance(e.value, ContextOverflow) == (kind is ContextOverflow)


def test_usage_is_marked_in_a_streamed_chunk_and_nothing_else_changes() -> None:
    up = upstream_from(UpstreamEntry(name="big", base_url="http://h"))
    plain = '{"choices":[{"delta":{"content":"hi"}}]}'
    assert mark_event(plain, up) == plain
    marked = json.loads(mark_event('{"choices":[],"usage":{"prompt_tokens":3}}', up))
    assert marked["usage"] == {"prompt_tokens": 3, "answered_by": "upstream:big"}
    assert mark_event('{"usage": null}', up) == '{"usage": null}'


def test_a_generate_request_in_openai_words() -> None:
    req = pb.GenerateRequest(
        model="m", chat=pb.ChatMessages(messages=[
            pb.ChatMessage(role="user", content="hi"),
            pb.ChatMessage(role="assistant", tool_calls=[pb.ToolCall(id="c1", name="f", arguments="{}")]),
            pb.ChatMessage(role="tool", content="42", tool_call_id="c1")]),
        sampling_params=pb.SamplingParams(temperature=0, max_tokens=5, stop=["x"], seed=3),
        structured=pb.StructuredOutput(json_schema='{"type": "object"}'),
        tools=[pb.Tool(name="f", parameters='{"type": "object"}')],
        tool_choice=pb.ToolChoice(mode=pb.ToolChoice.MODE_FUNCTION, function_name="f"))
    path, body = openai_body(req, "m")
    assert path == "/v1/chat/completions" and body["stream"] is True
    assert body["messages"][1]["tool_calls"][0]["function"] == {"name": "f", "arguments": "{}"}
    assert body["messages"][2]["tool_call_id"] == "c1"
    assert (body["temperature"], body["max_tokens"], body["stop"], body["seed"]) == (0, 5, ["x"], 3)
    assert "top_p" not in body
    assert body["response_format"]["json_schema"]["schema"] == {"type": "object"}
    assert body["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    path, body = openai_body(pb.GenerateRequest(prompt_token_ids=pb.TokenIds(ids=[1, 2]),
                                                structured=pb.StructuredOutput(regex="a+")), "m")
    assert path == "/v1/completions" and body["prompt"] == [1, 2] and body["structured_outputs"] == {"regex": "a+"}
    assert not forwardable(pb.GenerateRequest(chat=pb.ChatMessages(messages=[pb.ChatMessage(audio=b"RIFF")])))
