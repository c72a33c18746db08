"""`<think>` reasoning in content: moved to the reasoning field (Chat) or a reasoning item
(Responses), tags split anywhere, templates that pre-open the block, calls inside reasoning."""

from __future__ import annotations

import json

import pytest

from harness import sse_body
from kimi import ARG_BEGIN, CALL_BEGIN, CALL_END, SECTION_BEGIN, SECTION_END
from responses import response_json, responses_events, responses_sse
from toolshim.chat import ChatStreamRewriter, rewrite_chat_completion
from toolshim.lexers.base import ReasoningText, Text
from toolshim.lexers.think import ThinkLexer
from toolshim.responses import ResponsesStreamRewriter, rewrite_response_body
from toolshim.tools import RequestContext
from wire import check_chat_stream, check_responses_stream

TOOLS = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]


def lex(text: str, pieces: list[str] | None = None, preopened: bool = False):
    lexer = ThinkLexer(preopened=preopened)
    out = []
    for piece in pieces or [text]:
        out += lexer.feed(piece)
    out += lexer.finish()
    merged: list = []
    for seg in out:
        if merged and type(merged[-1]) is type(seg):
            merged[-1] = type(seg)(merged[-1].text + seg.text)
        else:
            merged.append(seg)
    return merged


@pytest.mark.parametrize("open_tag, close_tag", [("<think>", "</think>"), ("<reasoning>", "</reasoning>"), ("<thought>", "</thought>")])
def test_each_spelling_splits_reasoning_from_content(open_tag, close_tag):
    text = f"{open_tag}Weighing it.{close_tag}\n\nThe answer."
    assert lex(text) == [ReasoningText("Weighing it."), Text("The answer.")]


@pytest.mark.parametrize("model, open_tag, close_tag", [("ByteDance-Seed/Seed-OSS-36B-Instruct", "<seed:think>", "</seed:think>"), ("mistralai/Magistral-Small-2509", "[THINK]", "[/THINK]")])
def test_a_familys_own_spelling_is_split_where_its_dialect_runs(model, open_tag, close_tag):
    """The registry gives each family's own tags (`reasoning_tags`); another family's model
    writing them has written text."""
    from test_thinking_by_request import stream_content

    text = f"{open_tag}Weighing it.{close_tag}\n\nThe answer."
    for name, reasoning in ((model, "Weighing it."), ("Qwen/Qwen2.5-72B-Instruct", "")):
        result = stream_content(name, {}, [text])
        assert result["reasoning_content"] == reasoning, name
        assert result["content"] == ("The answer." if reasoning else text), name


def test_tags_split_at_every_character_give_the_same_result():
    text = "<think>a < b, so</think>\n\nYes <b>really</b>."
    whole = lex(text)
    assert whole == [ReasoningText("a < b, so"), Text("Yes <b>really</b>.")]
    for cut in range(1, len(text)):
        assert lex(text, [text[:cut], text[cut:]]) == whole, cut
    assert lex(text, list(text)) == whole


def test_preopened_output_starts_inside_reasoning():
    assert lex("I'm\nthinking</think>Hello", preopened=True) == [ReasoningText("I'm\nthinking"), Text("Hello")]


def test_tags_after_the_start_of_the_content_are_the_models_text():
    """Code that strips think tags, or an argument holding them, must reach the client intact."""
    assert lex("Hello</think> world") == [Text("Hello</think> world")]
    code = 'Strip it:\n```python\nif text.startswith("<think>"):\n    text = text.split("</think>")[-1]\n```'
    assert lex(code) == [Text(code)]
    assert lex(code, list(code)) == [Text(code)]


def test_a_preopened_model_that_writes_its_own_open_tag_loses_it():
    assert lex("<think>\nhmm</think>\n\nans", preopened=True) == [ReasoningText("\nhmm"), Text("ans")]


def test_only_the_running_dialects_end_reasoning():
    kimi = "<think>The <|tool_call_begin|> token is Kimi's.</think>ans"
    assert lex(kimi) == [ReasoningText("The <|tool_call_begin|> token is Kimi's."), Text("ans")]
    lexer = ThinkLexer(tool_starts=("<|tool_call_begin|>",))
    out = lexer.feed(kimi) + lexer.finish()
    assert out[0] == ReasoningText("The ") and out[1] == Text("<|tool_call_begin|>")


def test_prose_without_tags_streams_at_once():
    lexer = ThinkLexer()
    assert lexer.feed("plain text, a < b") == [Text("plain text, a < b")]
    assert lexer.idle


def chat_body(pieces: list[str], field: str = "content", extra: dict | None = None) -> bytes:
    base = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    chunks = [{**base, "choices": [{"index": 0, "delta": {field: p, **(extra or {})}, "finish_reason": None}]} for p in pieces]
    chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    return sse_body(chunks)


def chat(body: bytes, **request) -> dict:
    context = RequestContext.from_body(json.dumps({"model": "m", "messages": [], "tools": TOOLS, **request}).encode())
    rewriter = ChatStreamRewriter(context)
    return check_chat_stream(b"".join(rewriter.feed(body) + rewriter.close()))


def test_chat_reasoning_in_content_goes_to_reasoning_content():
    result = chat(chat_body(["<th", "ink>Let me ", "think.</thi", "nk>\n\nHi!"]))
    assert result["reasoning_content"] == "Let me think." and result["content"] == "Hi!"


def test_chat_reasoning_goes_to_the_field_upstream_uses():
    base = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    body = sse_body([
        {**base, "choices": [{"index": 0, "delta": {"reasoning": ""}, "finish_reason": None}]},
        {**base, "choices": [{"index": 0, "delta": {"content": "<think>hmm</think>ok"}, "finish_reason": None}]},
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ])
    result = chat(body)
    assert result["reasoning"] == "hmm" and result["reasoning_content"] == "" and result["content"] == "ok"


def test_chat_preopened_by_model_name_and_by_option():
    body = chat_body(["Thinking hard", "</think>", "Done."])
    result = chat(body, model="DeepSeek-R1-0528")
    assert (result["reasoning_content"], result["content"]) == ("Thinking hard", "Done.")
    context = RequestContext.from_body(json.dumps({"model": "plain-model", "messages": []}).encode())
    context.reasoning_preopened = True
    rewriter = ChatStreamRewriter(context)
    forced = check_chat_stream(b"".join(rewriter.feed(body) + rewriter.close()))
    assert (forced["reasoning_content"], forced["content"]) == ("Thinking hard", "Done.")


def test_a_kimi_call_inside_think_is_a_call_and_ends_the_reasoning():
    section = f"{SECTION_BEGIN}{CALL_BEGIN}functions.get_time:0{ARG_BEGIN}{{}}{CALL_END}{SECTION_END}"
    result = chat(chat_body(["<think>I need the time.", section, "</think>"]))
    assert result["reasoning_content"] == "I need the time."
    assert [c["name"] for c in result["tool_calls"]] == ["get_time"]
    assert result["finish_reason"] == "tool_calls"


def test_chat_json_body_moves_reasoning_too():
    completion = {"id": "c", "object": "chat.completion", "created": 1, "model": "m",
                  "choices": [{"index": 0, "message": {"role": "assistant", "content": "<think>why</think>\nBecause."}, "finish_reason": "stop"}]}
    context = RequestContext.from_body(b'{"model": "m", "messages": []}')
    assert rewrite_chat_completion(completion, context) is not None
    message = completion["choices"][0]["message"]
    assert message["reasoning_content"] == "why" and message["content"] == "Because."


def test_responses_think_in_a_message_becomes_a_reasoning_item():
    context = RequestContext.from_body(b'{"model": "m", "input": "hi"}')
    body = responses_sse(responses_events("m", ["<think>Pondering", ".</think>\n\n", "Answer."]))
    rewriter = ResponsesStreamRewriter(context)
    result = check_responses_stream(b"".join(rewriter.feed(body) + rewriter.close()))
    assert result["items"] == ["reasoning", "message"]
    assert (result["reasoning"], result["text"]) == ("Pondering.", "Answer.")
    json_body = response_json("m", "<think>Pondering.</think>Answer.")
    rewrite_response_body(json_body, context)
    assert [item["type"] for item in json_body["output"]] == ["reasoning", "message"]


def test_a_complete_declared_block_inside_think_is_a_call_and_anything_else_stays_reasoning():
    block = '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    result = chat(chat_body(["<think>verify result\n", block[:20], block[20:], "</think>Here is the answer."]))
    assert [c["name"] for c in result["tool_calls"]] == ["get_time"]
    assert result["reasoning_content"] == "verify result\n" and result["content"] == "Here is the answer."
    # llama.cpp's sample: a tag inside an unterminated <think> that is no call stays reasoning
    result = chat(chat_body(["<think><tool_call>nah uhg</tool_call>"]))
    assert result["tool_calls"] == [] and result["reasoning_content"] == "<tool_call>nah uhg</tool_call>"
    assert result["content"] == ""


def test_an_upstream_that_splits_reasoning_itself_is_not_read_as_preopened():
    """vLLM with --reasoning-parser deepseek_r1 sends reasoning_content, then content, and no
    </think>: the answer must stay content even for a model whose template pre-opens <think>."""
    base = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    body = sse_body([
        {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]},
        {**base, "choices": [{"index": 0, "delta": {"reasoning_content": "Multiply."}, "finish_reason": None}]},
        {**base, "choices": [{"index": 0, "delta": {"content": "391."}, "finish_reason": None}]},
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ])
    result = chat(body, model="deepseek-ai/DeepSeek-R1-0528")
    assert (result["reasoning_content"], result["content"]) == ("Multiply.", "391.")


def test_think_tags_inside_tool_arguments_are_kept():
    args = json.dumps({"path": "p.py", "content": 'x = s.split("</think>")[-1]  # <think>'})
    text = 'Writing.<tool_call>{"name": "get_time", "arguments": ' + args + "}</tool_call>"
    result = chat(chat_body([text[i : i + 6] for i in range(0, len(text), 6)]))
    assert [json.loads(c["arguments"]) for c in result["tool_calls"]] == [json.loads(args)]
    assert result["content"] == "Writing." and result["reasoning_content"] == ""


def test_a_preopened_model_behind_a_reasoning_parser_keeps_content_in_json_and_responses():
    completion = {"id": "c", "object": "chat.completion", "created": 1, "model": "deepseek-ai/DeepSeek-R1-0528",
                  "choices": [{"index": 0, "message": {"role": "assistant", "content": "It is sunny.", "reasoning_content": "Weather."}, "finish_reason": "stop"}]}
    context = RequestContext.from_body(b'{"model": "deepseek-ai/DeepSeek-R1-0528", "messages": []}')
    rewrite_chat_completion(completion, context)
    message = completion["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == ("Weather.", "It is sunny.")
    body = responses_sse(responses_events("deepseek-ai/DeepSeek-R1-0528", ["It is sunny."], reasoning_pieces=["Weather."]))
    rewriter = ResponsesStreamRewriter(RequestContext.from_body(b'{"model": "deepseek-ai/DeepSeek-R1-0528", "input": "hi"}'))
    assert b"".join(rewriter.feed(body) + rewriter.close()) == body


# -- a bare closer (issue 20 item 1): a family whose template may have opened the block ------------


def watched(pieces: list[str]) -> list:
    """ThinkLexer as ScopeLexers makes it for such a family when the request says nothing."""
    lexer = ThinkLexer(bare_close=("<tool_call>",))
    out = []
    for piece in pieces:
        out += lexer.feed(piece)
    return [seg.text for seg in out + lexer.finish()]


def test_a_bare_closer_never_reaches_content_at_every_split():
    # What came before it went out as content (it could not be told then); the closer goes, the
    # layout after it stays so that the two do not run together; a later closer is text.
    text = "The user asks.</think>\n\nHello </think> there"
    assert "".join(watched([text])) == "The user asks.\n\nHello </think> there"
    for cut in range(1, len(text)):
        assert "".join(watched([text[:cut], text[cut:]])) == "The user asks.\n\nHello </think> there", cut


def test_after_a_call_marker_the_closer_is_the_models_text():
    # arguments may hold the tags: once a call may have begun, nothing is watched
    text = 'Run it: <tool_call>{"name": "strip", "arguments": {"s": "</think>"}}</tool_call>'
    assert "".join(watched([text])) == text
    assert "".join(watched(list(text))) == text


def test_only_the_watching_families_drop_it():
    """Qwen3 without a word on thinking in the request: the closer goes. Llama (no template that
    opens the block) and Qwen3 with thinking turned off: it is the model's text."""
    from test_thinking_by_request import stream_content

    pieces = ["The user ", "asks.</th", "ink>\n\n", "Hello."]
    assert stream_content("Qwen/Qwen3-32B", {}, pieces)["content"] == "The user asks.\n\nHello."
    assert stream_content("meta-llama/Llama-3.3-70B", {}, pieces)["content"] == "".join(pieces)
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    assert stream_content("Qwen/Qwen3-32B", off, pieces)["content"] == "".join(pieces)


def test_the_reasoning_side_s_lexers_are_made_when_reasoning_comes():
    """A content channel's `<think>` side has its own chain of tag dialects, made the first time
    reasoning comes: a stream without `<think>` makes none (a stream's first read made them for
    nothing), and one with it reads a call inside it as ever."""
    from toolshim.calls import CallScope, RewriteStats
    from toolshim.lexers import ScopeLexers
    from toolshim.lexers.think import ReasoningSplit

    context = RequestContext.from_body(json.dumps({"model": "Qwen/Qwen3-32B", "tools": TOOLS, "stream": True}).encode())
    block = '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    for texts, thinks in (([f"Plain, then {block}", " and done."], False), ([f"<think>first {block}", "</think>then."], True)):
        lexer = ScopeLexers(CallScope(context, RewriteStats()), max_held=1 << 20).new_lexer(reasoning=False)
        assert type(lexer) is ReasoningSplit and lexer._reasoning is None
        out = [seg for text in texts for seg in lexer.feed(text)] + lexer.finish()
        assert (lexer._reasoning is not None) is thinks
        assert [seg.name for seg in out if type(seg).__name__ == "CallBegin"] == ["get_time"]
        assert "".join(seg.text for seg in out if type(seg) is Text) == ("Plain, then and done." if not thinks else "then.")
        assert "".join(seg.text for seg in out if type(seg) is ReasoningText) == ("" if not thinks else "first")
