"""The reasoning parsers (server/chat/reasoning.py): vLLM's qwen3 and deepseek_r1 rules on whole answers, the same
split from every chunking of a stream (tags split across chunks never leak), and the HTTP response shapes
(message.reasoning_content, delta.reasoning_content) built from the engine's outputs."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from nvllm.engine.async_engine import PendingRequest
from nvllm.engine.outputs import RequestOutput
from nvllm.sampling_params import SamplingParams, StructuredSpec
from nvllm.server.chat.reasoning import ReasoningStream, split_reasoning, thinking_requested
from nvllm.server.grpc.service import GeneratorService, chat_answer
from nvllm.server.http.openai_request import parse_chat
from nvllm.server.http.openai_response import ResponseBuilder

CASES = [
    # (text, reasoning, content) for deepseek_r1 and qwen3 with thinking on
    ("<think>\nLet me see.\n</think>\n\nBlue.", "\nLet me see.\n", "\n\nBlue."),
    ("Let me see.</think>Blue.", "Let me see.", "Blue."),             # the template wrote <think>
    ("\n<think>a</think>b", "a", "b"),                                  # blank before the tag
    ("<think>cut short by max_tokens", "cut short by max_tokens", ""),
    ("no tags at all", "no tags at all", ""),                           # unclosed: all reasoning
    ("<think></think>", "", ""),
    ("a</think>b</think>c", "a", "b</think>c"),                         # the first close ends it
    ("x<think>y</think>z", "x<think>y", "z"),                           # a tag inside is text
    ("<thi", "<thi", ""),                                               # a partial tag at the end is text
    ("a</thin", "a</thin", ""),
]


@pytest.mark.parametrize("parser", ["qwen3", "deepseek_r1"])
@pytest.mark.parametrize("text, reasoning, content", CASES)
def test_whole_answers(parser, text, reasoning, content):
    assert split_reasoning(parser, text) == (reasoning, content)


@pytest.mark.parametrize("text, reasoning, content", CASES)
def test_every_two_and_three_way_chunking_agrees(text, reasoning, content):
    for i in range(len(text) + 1):
        for j in range(i, len(text) + 1):
            stream = ReasoningStream("qwen3")
            parts = [stream.feed(text[:i]), stream.feed(text[i:j]), stream.feed(text[j:], final=True)]
            # The same split as the whole answer's, so no tag (nor a piece of one) leaks into either part.
            assert ("".join(p[0] for p in parts), "".join(p[1] for p in parts)) == (reasoning, content), (i, j)


def test_one_character_at_a_time_holds_only_a_possible_tag():
    stream = ReasoningStream("deepseek_r1")
    got = [stream.feed(c) for c in "<think>ab</think>cd"]
    assert got[:7] == [("", "")] * 7                      # the opening tag, held until whole, then dropped
    assert got[7:9] == [("a", ""), ("b", "")]
    assert got[9:17] == [("", "")] * 8                    # the closing tag, held
    assert got[17:] == [("", "c"), ("", "d")]
    assert stream.feed("", final=True) == ("", "")


def test_qwen3_enable_thinking_false_is_all_content():
    assert thinking_requested("qwen3", {"enable_thinking": False}) is False
    assert thinking_requested("qwen3", {"enable_thinking": True}) and thinking_requested("qwen3", None)
    assert thinking_requested("deepseek_r1", {"enable_thinking": False})     # R1 has no switch
    assert split_reasoning("qwen3", "Blue.</think>x", thinking=False) == ("", "Blue.</think>x")


def test_unknown_parser():
    with pytest.raises(ValueError, match="unknown reasoning parser 'qwen'"):
        ReasoningStream("qwen")


# ------------------------------------------------------------------------------------------ HTTP shapes


def out(text: str, finished: bool = False) -> RequestOutput:
    return RequestOutput("r", text, [1] * len(text), None, finished, "stop" if finished else None, None,
                         5, len(text), 0)


def builder(parser: str, thinks: bool = True, **body) -> ResponseBuilder:
    req = parse_chat({"messages": [{"role": "user", "content": "hi"}], **body}, "m", 4)
    return ResponseBuilder(req, "id", "m", parser, thinks)


PIECES = ["<thi", "nk>Hm", "m.</th", "ink>\n\nBl", "ue."]


def test_whole_message_has_reasoning_content():
    b = builder("qwen3")
    for i, p in enumerate(PIECES):
        b.add(0, out(p, finished=i == len(PIECES) - 1))
    message = b.response()["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "\n\nBlue.", "reasoning_content": "Hmm."}
    b = builder("qwen3")
    b.add(0, out("still thinking", finished=True))
    assert b.response()["choices"][0]["message"] == {"role": "assistant", "content": None,
                                                     "reasoning_content": "still thinking"}


def test_stream_deltas_carry_reasoning_content_apart():
    b = builder("qwen3")
    deltas = [c["choices"][0]["delta"] for i, p in enumerate(PIECES)
              for c in b.chunks(0, out(p, finished=i == len(PIECES) - 1))]
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    content = "".join(d.get("content") or "" for d in deltas)
    assert (reasoning, content) == ("Hmm.", "\n\nBlue.")
    assert not any("think>" in v for d in deltas for v in d.values())


def seq(params: SamplingParams, waits: bool = False) -> Any:
    """What PendingRequest reads of a Sequence: its id, prompt, params, that it is no pooling request, and
    whether its grammar waits for the thinking."""
    return SimpleNamespace(request_id="r", num_prompt_tokens=3, params=params, pooling=None,
                           structured_after_thinking=(1, object()) if waits else None)


def test_without_a_parser_nothing_changes():
    b = builder("")
    b.add(0, out("<think>a</think>b", finished=True))
    assert b.response()["choices"][0]["message"] == {"role": "assistant", "content": "<think>a</think>b"}
    b = builder("qwen3", chat_template_kwargs={"enable_thinking": False})
    b.add(0, out("Blue.", finished=True))
    assert b.response()["choices"][0]["message"] == {"role": "assistant", "content": "Blue.",
                                                     "reasoning_content": None}


def test_grpc_responses_carry_reasoning_text_apart():
    from grpc_health.v1._async import HealthServicer

    from nvllm.server.state import DaemonState

    state = DaemonState("m", HealthServicer(), 8, 8, 1 << 20)
    service = GeneratorService(state)
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    stream = chat_answer("deepseek_r1", "chat", chat, thinks=True)
    assert stream is not None
    rs = [service._response("r", out(p, finished=i == len(PIECES) - 1), 0.0, None, stream)
          for i, p in enumerate(PIECES)]
    assert "".join(r.reasoning_text for r in rs) == "Hmm." and "".join(r.text for r in rs) == "\n\nBlue."
    assert chat_answer("deepseek_r1", "prompt", "hi", thinks=True) is None
    assert chat_answer("", "chat", chat, thinks=True) is None


def test_a_constrained_answer_thinks_only_when_its_grammar_waits_for_the_thinking():
    constrained = SamplingParams(structured=StructuredSpec("json_object"))
    assert not PendingRequest(seq(constrained)).thinks          # masked from the first token: all content
    assert PendingRequest(seq(constrained, waits=True)).thinks and PendingRequest(seq(SamplingParams())).thinks
    b = builder("qwen3", thinks=False)
    b.add(0, out("{}", finished=True))
    assert b.response()["choices"][0]["message"] == {"role": "assistant", "content": "{}", "reasoning_content": None}
    stream = chat_answer("deepseek_r1", "chat", {"messages": []}, thinks=False)
    assert stream is not None and [(d.kind, d.text) for d in stream.feed("{}", final=True)] == [("text", "{}")]


def test_the_setting_and_its_flag(capsys: pytest.CaptureFixture[str]):
    from nvllm import cli
    from nvllm.cli import serve

    def settings(*flags: str):
        return serve.settings_from_args(cli.build_parser().parse_args(["serve", *flags]))

    assert settings().server.reasoning_parser == ""
    assert settings("--reasoning-parser", "deepseek_r1").server.reasoning_parser == "deepseek_r1"
    # An unknown name is a config error naming the setting and the names there are (nvllm serve exits 2).
    assert serve.main(cli.build_parser().parse_args(["serve", "--reasoning-parser", "qwen"])) == 2
    assert 'server.reasoning_parser must be one of "", "qwen3" or "deepseek_r1", got "qwen"' in capsys.readouterr().err


def test_tool_calls_are_read_from_the_content_after_the_thinking():
    from helpers.tool_call_cases import QWEN_TOOLS_TEMPLATE, SHORT_TOOLS

    answer = '<think>The time, then.</think>\n\n<tool_call>\n{"name": "get_day", "arguments": {}}\n</tool_call>'
    body = {"messages": [{"role": "user", "content": "hi"}], "tools": SHORT_TOOLS, "tool_choice": "auto"}

    def tool_builder() -> ResponseBuilder:
        return ResponseBuilder(parse_chat(body, "m", 4, QWEN_TOOLS_TEMPLATE), "id", "m", "qwen3")

    b = tool_builder()
    b.add(0, out(answer, finished=True))
    (choice,) = b.response()["choices"]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["reasoning_content"] == "The time, then." and message["content"] is None
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_day"]
    b = tool_builder()
    pieces = [answer[i:i + 5] for i in range(0, len(answer), 5)]
    deltas = [c["choices"][0]["delta"] for i, p in enumerate(pieces)
              for c in b.chunks(0, out(p, finished=i == len(pieces) - 1))]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "The time, then."
    names = [tc["function"]["name"] for d in deltas for tc in d.get("tool_calls") or [] if "name" in tc["function"]]
    assert names == ["get_day"] and not "".join(d.get("content") or "" for d in deltas).strip()
