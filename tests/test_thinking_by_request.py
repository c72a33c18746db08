"""Thinking follows the model family and the request (issue 20 item 1): whether an answer starts
inside reasoning the chat template opened, read from the request and the model name."""

from __future__ import annotations

import json

import pytest
from harness import chat_chunk, sse_body
from toolshim.backends import reasoning_preopened, thinking_requested
from toolshim.chat import ChatStreamRewriter
from toolshim.tools import RequestContext
from wire import check_chat_stream


@pytest.mark.parametrize(
    ("request_body", "said"),
    [
        ({"chat_template_kwargs": {"enable_thinking": True}}, True),
        ({"chat_template_kwargs": {"thinking": False}}, False),
        ({"thinking": {"type": "enabled", "budget_tokens": 100}}, True),
        ({"thinking": {"type": "adaptive"}}, True),
        ({"thinking": {"type": "disabled"}}, False),
        ({"reasoning_effort": "high"}, True),
        ({"reasoning_effort": "none"}, False),
        ({"reasoning": {"effort": "low"}}, True),
        ({"thinking": {"type": "enabled"}, "chat_template_kwargs": {"enable_thinking": False}}, False),
        ({}, None),
        ({"thinking": "yes please", "reasoning_effort": 3}, None),
    ],
)
def test_what_the_request_says_about_thinking(request_body, said):
    assert thinking_requested(request_body) is said


@pytest.mark.parametrize(
    ("model", "request_body", "preopened"),
    [
        ("deepseek-ai/DeepSeek-V3.1", {"chat_template_kwargs": {"thinking": True}}, True),
        ("deepseek-ai/DeepSeek-V3.1", {}, None),  # non-thinking by default: the lexers' table says no
        ("deepseek-reasoner", {}, True),
        ("deepseek-reasoner", {"thinking": {"type": "disabled"}}, False),
        ("zai-org/GLM-4.6", {"chat_template_kwargs": {"enable_thinking": True}}, True),
        ("zai-org/GLM-4.6", {"chat_template_kwargs": {"enable_thinking": False}}, False),
        ("MiniMaxAI/MiniMax-M2", {}, None),  # by name alone: as recorded answers show (no <think> in content)
        ("MiniMaxAI/MiniMax-M2", {"reasoning_effort": "medium"}, True),
        ("moonshotai/Kimi-K2-Thinking", {}, True),
        ("moonshotai/Kimi-K2.5", {"thinking": {"type": "enabled"}}, True),
        ("Qwen/Qwen3-235B-A22B-Thinking-2507", {}, True),
        ("Qwen/Qwen3-8B", {"chat_template_kwargs": {"enable_thinking": True}}, True),
        # Nemotron Nano 2 / Nemotron 3: the template ends with `<think>\n` when thinking is on
        # (llama.cpp, chat-parsers nemotron_v2 / nemotron_v3: "thinking forced open").
        ("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B", {"chat_template_kwargs": {"enable_thinking": True}}, True),
        ("nvidia/NVIDIA-Nemotron-Nano-9B-v2", {"chat_template_kwargs": {"enable_thinking": False}}, False),
        ("meta-llama/Llama-3.3-70B", {"reasoning_effort": "high"}, None),  # no template that opens it
        ("my-model-thinking", {}, True),
    ],
)
def test_by_model_family_and_request(model, request_body, preopened):
    assert reasoning_preopened(model, request_body) is preopened


def stream_content(model: str, request: dict, pieces: list[str]) -> dict:
    rewriter = ChatStreamRewriter(RequestContext.from_request({"model": model, **request}))
    body = sse_body([chat_chunk(model, role="assistant"), *(chat_chunk(model, content=p) for p in pieces), chat_chunk(model, finish_reason="stop")])
    return check_chat_stream(b"".join(rewriter.feed(body) + rewriter.close()))


def test_a_thinking_request_reads_the_start_as_reasoning():
    result = stream_content("zai-org/GLM-4.6", {"chat_template_kwargs": {"enable_thinking": True}}, ["The user ", "asks.</think>", "Hello!"])
    assert result["reasoning_content"] == "The user asks." and result["content"] == "Hello!"
    off = stream_content("zai-org/GLM-4.6", {"chat_template_kwargs": {"enable_thinking": False}}, ["Hello ", "there."])
    assert off["content"] == "Hello there." and off["reasoning_content"] == ""


def test_the_option_still_overrides_and_refuses_other_values():
    from mitmproxy import exceptions
    from mitmproxy.test import taddons
    from toolshim.addon import ToolShim

    addon = ToolShim()
    with taddons.context(addon) as tctx:
        with pytest.raises(exceptions.OptionsError, match="maybe"):
            tctx.configure(addon, toolshim_reasoning_preopened="maybe")
        tctx.configure(addon, toolshim_reasoning_preopened="no")
        context = addon._with_options(RequestContext.from_request({"model": "MiniMax-M2"}))
        assert context.reasoning_preopened is False


def test_nemotron_thinking_then_its_call():
    """Nemotron Nano 2 with thinking on: the output starts inside the block its template opened;
    `</think>` ends it and the `<TOOLCALL>` list after it is the call (the Nano-v2 template's
    format; llama.cpp's nemotron_v2 parser reads the same output)."""
    tools = {"tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]}
    request = {"chat_template_kwargs": {"enable_thinking": True}, **tools}
    pieces = ["Oslo's weather", " is asked.\n</think>\n\n", '<TOOLCALL>[{"name": "get_weather", ', '"arguments": {"city": "Oslo"}}]</TOOLCALL>']
    result = stream_content("nvidia/NVIDIA-Nemotron-Nano-9B-v2", request, pieces)
    assert result["reasoning_content"].strip() == "Oslo's weather is asked."
    assert result["content"].strip() == ""
    assert [(c["name"], c["arguments"]) for c in result["tool_calls"]] == [("get_weather", '{"city":"Oslo"}')]


@pytest.mark.parametrize("cut", [0, 2, 5, 8])
def test_deepseek_v4_thinking_writes_its_call_before_think_end(cut):
    """DeepSeek-V4 with thinking on writes its DSML block inside the reasoning its template
    opened and only then `</think>` (vLLM #46079, DeepSeek-V4's template): the block ends the
    reasoning and is the call; the `</think>` after it is markup, never content (issue 20 item 1),
    in whatever pieces it comes."""
    tools = {"tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]}
    request = {"chat_template_kwargs": {"thinking": True}, **tools}
    block = '<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Oslo</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>'
    pieces = ["I will check", " the weather.\n\n" + block, "</think>"[:cut], "</think>"[cut:] + "Done."]
    result = stream_content("deepseek-ai/DeepSeek-V4", request, [p for p in pieces if p])
    assert result["reasoning_content"].strip() == "I will check the weather."
    assert [(c["name"], json.loads(c["arguments"])) for c in result["tool_calls"]] == [("get_weather", {"city": "Oslo"})]
    assert result["content"] == "Done."
