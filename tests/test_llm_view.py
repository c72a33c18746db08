"""The "LLM stream" view's renderer (addon/toolshim/llm_view.py), without mitmproxy's view machinery.

Golden files: `tests/golden/view/<fixture>.txt` is the plain text of the view of a bundled fixture
after toolshim rewrote it offline (one `mitmdump -nr … -w … -s addon/toolshim.py` run for all),
with minted ids (`call_…`, `fc_…`, `msg_…`, `rs_…`, `toolu_…` + 24 random characters) replaced by
numbered placeholders (an upstream's id of that shape, such as an Anthropic `msg_…`, too). The flow's comment (the addon's summary line, tested with the addon) is left out,
so that the files hold only what this view decides. Each was read by hand against the fixture's
`.expected.json` and its recorded upstream body. After an intended change of the view (or of what toolshim sends), rewrite them
with

    TOOLSHIM_REGENERATE_GOLDEN=1 .venv/bin/pytest tests/test_llm_view.py

and read the diff before committing it: without the variable, any difference fails.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from mitmproxy import io as mio

from harness import PROJECT_ROOT, read_flows, run_offline, sse_body
from toolshim import llm_view
from toolshim.apis import CHAT, MESSAGES, METADATA_KEY, RESPONSES, api_of
from toolshim.llm_view import MARKUP, MODEL_TEXT, NUMBER, render

GOLDEN_DIR = Path(__file__).parent / "golden" / "view"
GOLDEN_FIXTURES = (
    "kimi_seed_000_reasoning",
    "kimi_calls_in_content",
    "sentinel_chat_stream_text_then_two_calls",
    "responses_sentinel_stream_text_call_text",
    "responses_kimi_in_reasoning_stream",
    "dialect_qwen3_coder_xml",
    "dialect_gpt_oss_harmony",
    "plain_stream_without_markup",
    "kimi_non_streaming",
    "broken_native_snapshot_and_double_encoded",
    "messages_kimi_in_thinking_stream",
    "messages_broken_native_split_tool_use",
    "messages_kimi_non_streaming",
)
REGENERATE = os.environ.get("TOOLSHIM_REGENERATE_GOLDEN") == "1"
MINTED_ID = re.compile(r"\b(call|fc|msg|rs|toolu)_[A-Za-z0-9]{24}\b")


@pytest.fixture(scope="module")
def rewritten(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The golden fixtures after one offline mitmdump run with toolshim, by name."""
    tmp = tmp_path_factory.mktemp("view")
    originals = {name: read_flows(PROJECT_ROOT / "flows" / f"{name}.flow")[0] for name in GOLDEN_FIXTURES}
    with open(tmp / "in.flow", "wb") as f:
        writer = mio.FlowWriter(f)
        for flow in originals.values():
            writer.add(flow)
    run = run_offline(tmp / "in.flow", tmp / "out.flow")
    assert run.returncode == 0, run.stdout + run.stderr
    out = {flow.id: flow for flow in read_flows(tmp / "out.flow")}
    return {name: out[flow.id] for name, flow in originals.items()}


def view_text(flow: Any) -> str:
    """The view's text for a flow, without the flow's comment."""
    upstream = (flow.metadata.get(METADATA_KEY) or {}).get("upstream")
    return llm_view.plain_text(render(flow.response.content, api_of(flow), upstream)) + "\n"


def stable_ids(text: str) -> str:
    """Minted ids replaced by `<prefix>_<N>`, numbered per prefix in order of appearance."""
    seen: dict[str, str] = {}

    def placeholder(match: re.Match[str]) -> str:
        minted = match.group()
        if minted not in seen:
            count = sum(1 for known in seen if known.startswith(match.group(1) + "_"))
            seen[minted] = f"{match.group(1)}_<{count + 1}>"
        return seen[minted]

    return MINTED_ID.sub(placeholder, text)


@pytest.mark.parametrize("name", GOLDEN_FIXTURES)
def test_the_view_of_a_rewritten_fixture_matches_its_golden_file(name: str, rewritten: dict[str, Any]) -> None:
    text = stable_ids(view_text(rewritten[name]))
    golden = GOLDEN_DIR / f"{name}.txt"
    if REGENERATE:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text, encoding="utf-8")
    assert golden.exists(), f"{golden.name} is missing: TOOLSHIM_REGENERATE_GOLDEN=1 writes it (then read it)"
    assert text == golden.read_text(encoding="utf-8")


def test_every_golden_file_belongs_to_a_fixture_the_test_renders() -> None:
    assert sorted(path.stem for path in GOLDEN_DIR.glob("*.txt")) == sorted(GOLDEN_FIXTURES)


def test_the_view_shows_the_calls_of_the_expected_file(rewritten: dict[str, Any]) -> None:
    """A check of the golden files that does not depend on them: every expected call's name and
    pretty arguments appear in the client's result, and the original's markup in its events."""
    for name in GOLDEN_FIXTURES:
        expected = json.loads((PROJECT_ROOT / "flows" / f"{name}.expected.json").read_text())
        text = view_text(rewritten[name])
        client, _, original = text.partition("upstream sent (original)")
        calls = list(expected.get("tool_calls", expected.get("calls", [])))
        blocks = expected["content"] if isinstance(expected.get("content"), list) else []  # Messages: content blocks
        calls += [{"name": block["name"], "arguments": json.dumps(block["input"])} for block in blocks if block["type"] == "tool_use"]
        for call in calls:
            pretty = json.dumps(json.loads(call["arguments"]), indent=2, ensure_ascii=False).split("\n")
            assert f": {call['name']}  " in client, (name, call["name"])
            assert all(row.strip() in client for row in pretty), (name, call["arguments"])
        if calls:
            assert llm_view.LEAKED_MARKUP.search(original) or "broken_native" in name, name


# -- the renderer on hand-made bodies ----------------------------------------------------------------


def chunk(delta: dict[str, Any] | None = None, finish_reason: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish_reason}], **extra}


def marked_texts(lines: list[llm_view.Line]) -> list[str]:
    """The texts shown in the markup style, joined where they follow each other on a line."""
    found = []
    for line in lines:
        run = ""
        for style, text in line:
            if style == MARKUP:
                run += text
            elif run:
                found.append(run)
                run = ""
        if run:
            found.append(run)
    return found


def event_lines(lines: list[llm_view.Line]) -> list[llm_view.Line]:
    return [line for line in lines if any(style == NUMBER for style, _ in line)]


def content_body(*pieces: str) -> bytes:
    return sse_body([chunk({"content": piece}) for piece in pieces])


@pytest.mark.parametrize(
    "marker",
    [
        "<|tool_calls_section_begin|>",  # Kimi
        "<|tool_calls_section_end|",  # Kimi, the truncated spelling
        "<tool_call>",  # Hermes
        "</think>",
        "[TOOL_CALLS]",  # Mistral
        "<function=get_weather>",  # Qwen3-Coder, Llama
        '<parameter name="city">',  # MiniMax
        "<｜tool▁calls▁begin｜>",  # DeepSeek
        '<｜DSML｜invoke name="get_weather">',  # DeepSeek DSML
        "<|channel|>",  # gpt-oss
        "<minimax:tool_call>",
        "<arg_key>",  # GLM
        "<parameter=city>",  # Qwen3-Coder
    ],
)
def test_the_markers_of_each_dialect_are_highlighted(marker: str) -> None:
    lines = render(content_body("Sure. ", marker + "x"), CHAT)
    assert marked_texts(event_lines(lines)) == [llm_view._escape(marker, "'")]
    assert llm_view._escape(marker, "'") in marked_texts(lines[-3:])  # and in the result's content


def test_prose_and_look_alikes_are_not_highlighted() -> None:
    lines = render(content_body("a < b and [TOOL] <toolcall> <|x y|> <function>"), CHAT)
    assert marked_texts(lines) == ["<function>", "<function>"]  # a tag of a dialect: its event and the result


def test_a_marker_streamed_in_pieces_is_highlighted_in_every_event_carrying_a_piece() -> None:
    lines = render(content_body("Let me look.\n", "<", "function", "=", "search", ">", "\n", "<", "/", "function", ">", " done"), CHAT)
    assert marked_texts(event_lines(lines)) == ["<", "function", "=", "search", ">", "<", "/", "function", ">"]
    text_only = [text for line in event_lines(lines) for style, text in line if style == MODEL_TEXT and text not in ("'", "")]
    assert text_only == ["Let me look.\\n", "\\n", " done"]


def test_one_line_per_event_whatever_the_text_holds() -> None:
    body = sse_body([chunk({"content": "line one\nline two\r\n\ttab \u2028 \x1b[31m"}), chunk({}, "stop")])
    lines = event_lines(render(body, CHAT))
    assert len(lines) == 3  # two chunks and [DONE]
    first = llm_view.plain_text([lines[0]])
    assert "\n" not in first and "\r" not in first and "\x1b" not in first
    assert "'line one\\nline two\\r\\n\\ttab \\u2028 \\x1b[31m'" in first


def test_names_ids_and_types_from_the_body_cannot_break_a_line() -> None:
    call = {"index": 0, "id": "id\n1", "function": {"name": "get\nweather", "arguments": "{}"}}
    chat = sse_body([chunk({"tool_calls": [call]}, "stop\r"), "", ":a\x85b"])
    responses = sse_body([{"type": "response.\ncreated", "response": {"status": "in\u2028progress"}}])
    for lines in (render(chat, CHAT, upstream=chat, comment="two\nlines"), render(responses, RESPONSES)):
        texts = [text for line in lines for _, text in line]
        assert not any(llm_view._CONTROL.search(text) for text in texts), texts
    assert "tool_calls[0]: get\\nweather  id=id\\n1" in llm_view.plain_text(render(chat, CHAT))


def test_the_result_pretty_prints_arguments_and_keeps_what_is_not_json() -> None:
    body = sse_body(
        [
            chunk({"tool_calls": [{"index": 0, "id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": "Paris", "days": [1, 2], '}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"metric": true}'}}]}),
            chunk({"tool_calls": [{"index": 1, "id": "c2", "type": "function", "function": {"name": "bash", "arguments": "ls -la"}}]}),
            chunk({}, "tool_calls"),
        ]
    )
    result = llm_view.plain_text(render(body, CHAT)).split("\nresult\n")[1]
    assert result.split("\n")[:12] == [
        "  tool_calls[0]: get_weather  id=c1",
        "    {",
        '      "city": "Paris",',
        '      "days": [',
        "        1,",
        "        2",
        "      ],",
        '      "metric": true',
        "    }",
        "  tool_calls[1]: bash  id=c2",
        "    (not JSON; as sent:)",
        "    arguments: 'ls -la'",
    ]
    assert "  finish_reason: tool_calls" in result


def test_the_request_repairs_come_first_then_the_turns_not_restored() -> None:
    body = sse_body([chunk({"content": "Hi."}, "stop")])
    info = {
        "repairs": [{"repair": "reasoning", "at": "messages[1]"}, {"repair": "kimi_ids", "at": "messages[1].tool_calls[0]", "id": "functions.bash:0"}],
        "reasoning_missing": ["messages[3]"],
        "original": b"{}",
    }
    lines = llm_view.plain_text(render(body, CHAT, comment="toolshim: request: reasoning restored", request_repairs=info)).splitlines()
    assert lines[:6] == [
        "toolshim: request: reasoning restored",
        "request repaired by toolshim",
        "  reasoning  messages[1]",
        "  kimi_ids  messages[1].tool_calls[0]  id=functions.bash:0",
        "  reasoning not known for messages[3]: left as the client sent it",
        "",
    ]
    assert llm_view.plain_text(render(body, CHAT, request_repairs={"repairs": "garbage"})) == llm_view.plain_text(render(body, CHAT))


def test_mirrored_reasoning_fields_are_shown_once() -> None:
    body = sse_body([chunk({"reasoning": "Hmm.", "reasoning_content": "Hmm."}), chunk({"content": "Hi."}, "stop")])
    text = llm_view.plain_text(render(body, CHAT))
    assert "chunk   reasoning_content/reasoning 'Hmm.'" in text
    assert "  reasoning_content/reasoning: 'Hmm.'" in text and "  content: 'Hi.'" in text


@pytest.mark.parametrize(
    "body, shown",
    [
        (b": keep-alive\n\ndata: [DONE]\n\n", ["comment  : keep-alive", "[DONE]"]),
        (b"data: not json at all\n\n", ["data  not JSON: 'not json at all'"]),
        (b"data: [1, 2]\n\n", ["data  a JSON array, not an event: '[1, 2]'"]),
        (b'data: "text"\n\n', ["data  a JSON string, not an event: '\"text\"'"]),
        (b"event: ping\n\n", ["ping"]),
        (b'data: {"choices": "oops", "usage": 5}\n\n', ["chunk  usage=5"]),
        (b'data: {"choices": [{"delta": {"content": "cut', ["data  not JSON:"]),
    ],
)
def test_odd_events_are_shown_as_such(body: bytes, shown: list[str]) -> None:
    rows = [llm_view.plain_text([line]).split(maxsplit=1)[1] for line in event_lines(render(body, CHAT))]
    assert len(rows) == len(shown)
    assert all(row.startswith(expected) for row, expected in zip(rows, shown)), rows


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"  \n",
        b"[1, 2]",
        b"{not json",
        b'{"choices": [{"message": "no"}], "usage": []}',
        b"data: \xff\xfe{\n\n",
        b'data: {"choices": [{"index": "x", "delta": [], "finish_reason": {}}]}\n\n',
        b'data: {"choices": [{"delta": {"tool_calls": [{"index": true}, "x", {"function": {"arguments": {"a": 1}}}]}}]}\n\n',
        b'data: {"type": 5, "output_index": "x", "item": [], "response": {"output": 3}}\n\n',
        b"\r\r\n\n:\ndata\nevent:\nid: 1\nretry: x\n",
        b'data: {"type": "content_block_start", "index": 0, "content_block": []}\n\ndata: {"type": "content_block_delta", "index": true, "delta": 3}\n\n',
        b'data: {"type": "content_block_delta", "index": 7, "delta": {"type": "input_json_delta", "partial_json": 5}}\n\n',
        b'data: {"type": "message_delta", "delta": [], "usage": 4}\n\ndata: {"type": "message_start", "message": {"usage": []}}\n\n',
        b'{"type": "message", "content": [3, {"type": "tool_use"}, {"type": "thinking", "thinking": 5}], "usage": "x"}',
    ],
)
@pytest.mark.parametrize("api", [CHAT, RESPONSES, MESSAGES, None])
def test_bad_input_never_raises(body: bytes, api: str | None) -> None:
    lines = render(body, api, upstream=body, comment="c")
    assert lines[0] == [(llm_view.TITLE, "c")]
    assert all(isinstance(style, str) and isinstance(text, str) for line in lines for style, text in line)


def test_what_is_no_body_is_said_so() -> None:
    assert [(llm_view.NOTE, "(empty body)")] in render(b"", CHAT)
    errors = [llm_view.plain_text([line]) for line in render(b"[1, 2]", CHAT) if line and line[0][0] == llm_view.ERROR]
    assert errors == ["  error: the body is a JSON array, not an object"]


def test_invalid_utf8_is_shown_with_replacement_characters() -> None:
    body = b'data: {"choices": [{"delta": {"content": "caf\xc3"}}]}\n\ndata: {"choices": [{"delta": {"content": "\xe9!"}}]}\n\n'
    text = llm_view.plain_text(render(body, CHAT))
    assert "content 'caf\ufffd'" in text and "content '\ufffd!'" in text


def test_tool_call_entries_without_index_join_by_id() -> None:
    entry = lambda call_id, name, arguments: chunk({"tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]})  # noqa: E731
    body = sse_body([entry("a", "f", '{"x":'), entry("a", "f", " 1}"), entry("b", "g", "{}")])
    text = llm_view.plain_text(render(body, CHAT))
    assert "tool_calls[?]: f  id=a\n    {\n      \"x\": 1\n    }" in text
    assert "tool_calls[?]: g  id=b\n    {}" in text


def test_the_event_lines_are_capped_but_the_result_reads_every_event() -> None:
    body = content_body(*(f"{n} " for n in range(30)))
    lines = render(body, CHAT, max_events=10)
    assert len(event_lines(lines)) == 10
    text = llm_view.plain_text(lines)
    assert "… 21 more events (the result reads them all)" in text  # 30 chunks and [DONE]
    assert "content: '" + "".join(f"{n} " for n in range(30)) + "'" in text


def test_a_long_event_text_is_cut_on_its_line_but_whole_in_the_result() -> None:
    text = llm_view.plain_text(render(content_body("x" * 1500), CHAT))
    event = next(row for row in text.split("\n") if "chunk" in row)
    assert event.endswith("'" + "x" * 1000 + "' …+500 characters")
    assert "content: '" + "x" * 1500 + "'" in text


def test_a_large_body_renders_with_work_linear_in_its_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """Counted, not timed: the characters searched for markup and the bytes parsed as JSON."""
    work = {"searched": 0, "parsed": 0}
    spans, loads = llm_view._markup_spans, llm_view.orjson.loads

    def counting_spans(text: str):
        work["searched"] += len(text)
        return spans(text)

    def counting_loads(data):
        work["parsed"] += len(data)
        return loads(data)

    monkeypatch.setattr(llm_view, "_markup_spans", counting_spans)
    monkeypatch.setattr(llm_view.orjson, "loads", counting_loads)
    per_byte = []
    for tokens in (2_000, 40_000):
        body = content_body(*(["tok <"] * tokens))  # a `<` in every event: markup may begin anywhere
        work.update(searched=0, parsed=0)
        lines = render(body, CHAT)
        assert len(lines) < 2_020  # the event lines are capped
        per_byte.append((work["searched"] + work["parsed"]) / len(body))
    assert per_byte[1] <= 1.3 * per_byte[0] and per_byte[1] < 3, per_byte


def test_the_comment_comes_first_and_the_original_after_the_rewritten_body() -> None:
    lines = render(content_body("new"), CHAT, upstream=content_body("old"), comment="toolshim: kimi → 1 call\nmore")
    titles = [text for line in lines for style, text in line if style == llm_view.TITLE and not text.startswith(" ")]
    assert titles == ["toolshim: kimi → 1 call", "more", "client got (rewritten by toolshim)", "upstream sent (original)"]
    text = llm_view.plain_text(lines)
    assert text.index("'new'") < text.index("upstream sent") < text.index("'old'")


def test_a_json_body_shows_its_result_and_the_original_result() -> None:
    message = {"role": "assistant", "content": "Hi", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    body = json.dumps({"choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]}).encode()
    original = json.dumps({"choices": [{"index": 0, "message": {"content": "Hi<tool_call>{}</tool_call>"}, "finish_reason": "stop"}]}).encode()
    lines = render(body, CHAT, upstream=original)
    text = llm_view.plain_text(lines)
    assert text.count("result (JSON body, not streamed)") == 2 and "events" not in text
    assert "tool_calls[0]: f  id=c" in text and "finish_reason: stop" in text
    assert marked_texts(lines) == ["<tool_call>", "</tool_call>"]


def test_responses_items_are_built_from_the_events() -> None:
    def event(kind: str, **fields: Any) -> dict[str, Any]:
        return {"type": kind, **fields}

    body = sse_body(
        [
            event("response.created", response={"status": "in_progress", "output": []}),
            event("response.output_item.added", output_index=0, item={"type": "reasoning", "id": "rs"}),
            event("response.reasoning_text.delta", output_index=0, delta="Think <|tool_call_begin|>"),
            event("response.output_item.added", output_index=1, item={"type": "function_call", "name": "f", "call_id": "c1", "arguments": ""}),
            event("response.output_item.done", output_index=1, item={"type": "function_call", "name": "f", "call_id": "c1", "arguments": '{"a": 1}'}),
            event("response.output_item.added", output_index=2, item={"type": "message"}),
            event("response.output_text.delta", output_index=2, delta="Done."),
        ],
        done=False,
    )
    lines = render(body, RESPONSES)
    text = llm_view.plain_text(lines)
    result = text.split("\nresult\n")[1].split("\n")
    assert result == [
        "  [0] reasoning: 'Think <|tool_call_begin|>'",
        "  [1] function_call: f  call_id=c1  id=",
        "    {",
        '      "a": 1',
        "    }",
        "  [2] message: 'Done.'",
        "  status: in_progress",  # cut before its terminal event
    ]
    assert re.search(r"\n +4  response\.output_item\.added +\[1\] function_call f call_id=c1\n", text)
    assert marked_texts(lines) == ["<|tool_call_begin|>", "<|tool_call_begin|>"]


def test_a_responses_json_body_shows_its_output_items() -> None:
    body = json.dumps(
        {
            "object": "response",
            "status": "completed",
            "output": [
                {"type": "message", "content": [{"type": "output_text", "text": "Hi."}, {"type": "refusal", "refusal": "No."}]},
                {"type": "web_search_call", "id": "ws"},
            ],
            "usage": {"total_tokens": 3},
        }
    ).encode()
    result = llm_view.plain_text(render(body, RESPONSES)).split("\n")[1:]
    assert result == [
        "  [0] message: 'Hi.'",
        "  [0] message refusal: 'No.'",
        "  [1] web_search_call",
        "  status: completed",
        '  usage: {"total_tokens":3}',
    ]


def test_a_body_of_an_unknown_api_is_read_by_its_look() -> None:
    text = llm_view.plain_text(render(b'data: {"type": "response.created", "response": {"status": "queued"}}\n\n', None))
    assert text.startswith("not the response of an LLM call toolshim reads: shown as a Responses API body")
    assert "status: queued" in text


@pytest.mark.parametrize("api", [CHAT, RESPONSES])
def test_an_error_body_shows_its_error(api: str) -> None:
    body = b'{"object": "error", "message": "The engine is overloaded.", "code": 500}'  # vLLM's shape
    assert '  error: {"object":"error","message":"The engine is overloaded.","code":500}' in llm_view.plain_text(render(body, api))
    openai_shape = llm_view.plain_text(render(b'{"error": {"message": "bad"}}', api))
    assert '  error: {"message":"bad"}' in openai_shape


def test_a_stream_cut_before_its_end_says_so() -> None:
    body = content_body("Hello")[: -len("data: [DONE]\n\n")] + b'data: {"choices": [{"index": 0, "delta": {"content": " wor'
    text = llm_view.plain_text(render(body, CHAT))
    assert "not JSON: '{\"choices\"" in text
    assert text.endswith("result\n  content: 'Hello'\n  finish_reason: (none)")


# -- the Anthropic Messages API ----------------------------------------------------------------------


def anthropic_sse(events: list[dict[str, Any]]) -> bytes:
    return b"".join(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode() for event in events)


def block_start(index: int, block: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": block}


def block_delta(index: int, **delta: Any) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": delta}


def test_a_messages_stream_shows_each_event_and_the_blocks_a_client_builds() -> None:
    body = anthropic_sse(
        [
            {"type": "message_start", "message": {"id": "msg_1", "model": "m", "usage": {"input_tokens": 9, "output_tokens": 1}}},
            {"type": "ping"},
            block_start(0, {"type": "thinking", "thinking": "", "signature": ""}),
            block_delta(0, type="thinking_delta", thinking="Run <"),
            block_delta(0, type="thinking_delta", thinking="|tool_call_begin|> it."),
            block_delta(0, type="signature_delta", signature="c2ln"),
            {"type": "content_block_stop", "index": 0},
            block_start(1, {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {}}),
            block_delta(1, type="input_json_delta", partial_json='{"command": '),
            block_delta(1, type="input_json_delta", partial_json='"ls", "n": [1, true]}'),
            {"type": "content_block_stop", "index": 1},
            block_start(2, {"type": "tool_use", "id": "toolu_2", "name": "noop", "input": {"only": "at start"}}),
            {"type": "content_block_stop", "index": 2},
            block_start(3, {"type": "redacted_thinking", "data": "xyz"}),
            {"type": "content_block_stop", "index": 3},
            block_start(4, {"type": "text", "text": ""}),
            block_delta(4, type="text_delta", text="Done."),
            block_delta(4, type="citations_delta", citation={"cited_text": "a"}),
            {"type": "content_block_stop", "index": 4},
            {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None}, "usage": {"output_tokens": 30}},
            {"type": "message_stop"},
        ]
    )
    lines = render(body, MESSAGES)
    text = llm_view.plain_text(lines)
    events, result = text.split("\nresult\n")
    rows = [row.split(maxsplit=1)[1] for row in events.split("\n")[1:]]
    assert rows == [
        'message_start        id=msg_1  model=m  usage={"input_tokens":9,"output_tokens":1}',
        "ping",
        "content_block_start  [0] thinking",
        "content_block_delta  [0] thinking  'Run <'",
        "content_block_delta  [0] thinking  '|tool_call_begin|> it.'",
        "content_block_delta  [0] thinking  signature 'c2ln'",
        "content_block_stop   [0] thinking",
        "content_block_start  [1] tool_use bash  id=toolu_1",
        "content_block_delta  [1] tool_use bash  '{\"command\": '",
        "content_block_delta  [1] tool_use bash  '\"ls\", \"n\": [1, true]}'",
        "content_block_stop   [1] tool_use bash",
        'content_block_start  [2] tool_use noop  id=toolu_2  input={"only":"at start"}',
        "content_block_stop   [2] tool_use noop",
        "content_block_start  [3] redacted_thinking",
        "content_block_stop   [3] redacted_thinking",
        "content_block_start  [4] text",
        "content_block_delta  [4] text  'Done.'",
        'content_block_delta  [4] text  citations_delta {"citation":{"cited_text":"a"}}',
        "content_block_stop   [4] text",
        'message_delta        stop_reason=tool_use  usage={"output_tokens":30}',
        "message_stop",
    ]
    assert result.split("\n") == [
        "  [0] thinking: 'Run <|tool_call_begin|> it.'",
        "  [0] thinking signature: 'c2ln'",
        "  [1] tool_use: bash  id=toolu_1",
        "    {",
        '      "command": "ls",',
        '      "n": [',
        "        1,",
        "        true",
        "      ]",
        "    }",
        "  [2] tool_use: noop  id=toolu_2",
        "    {",
        '      "only": "at start"',
        "    }",
        '  [3] redacted_thinking {"data":"xyz"}',
        "  [4] text: 'Done.'",
        "  stop_reason: tool_use",
        '  usage: {"input_tokens":9,"output_tokens":30}',  # message_start's, updated by message_delta's
    ]
    # The marker streamed in two pieces of the thinking is highlighted in both events and the result.
    assert marked_texts(lines) == ["<", "|tool_call_begin|>", "<|tool_call_begin|>"]


def test_a_thinking_block_without_a_signature_says_so() -> None:
    body = anthropic_sse([block_start(0, {"type": "thinking", "thinking": "Hmm."}), {"type": "content_block_stop", "index": 0}])
    assert "  [0] thinking signature: (none)" in llm_view.plain_text(render(body, MESSAGES)).split("\n")


def test_a_messages_json_body_and_an_error_body() -> None:
    message = {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "m",
        "content": [
            {"type": "thinking", "thinking": "Plan.", "signature": ""},
            {"type": "text", "text": "Hi <tool_call>"},
            {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}},
        ],
        "stop_reason": "tool_use", "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 2},
    }  # fmt: skip
    lines = render(json.dumps(message).encode(), MESSAGES)
    assert llm_view.plain_text(lines).split("\n") == [
        "result (JSON body, not streamed)",
        "  [0] thinking: 'Plan.'",
        "  [0] thinking signature: ''",
        "  [1] text: 'Hi <tool_call>'",
        "  [2] tool_use: f  id=toolu_1",
        "    {",
        '      "a": 1',
        "    }",
        "  stop_reason: tool_use",
        '  usage: {"input_tokens":1,"output_tokens":2}',
    ]
    assert marked_texts(lines) == ["<tool_call>"]
    error = b'{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}'
    assert llm_view.plain_text(render(error, MESSAGES)).split("\n") == [
        "result (JSON body, not streamed)",
        '  error: {"type":"overloaded_error","message":"Overloaded"}',
    ]
    streamed_error = anthropic_sse([{"type": "error", "error": {"type": "api_error", "message": "boom"}}])
    assert '  error: {"type":"api_error","message":"boom"}' in llm_view.plain_text(render(streamed_error, MESSAGES)).split("\n")


@pytest.mark.parametrize(
    "body",
    [
        anthropic_sse([{"type": "message_start", "message": {"id": "msg_1", "content": []}}]),
        b'{"id": "msg_1", "type": "message", "content": []}',
        b'{"type":"message","content":[]}',
    ],
)
def test_a_messages_body_of_an_unknown_api_is_read_by_its_look(body: bytes) -> None:
    text = llm_view.plain_text(render(body, None))
    assert text.startswith("not the response of an LLM call toolshim reads: shown as an Anthropic Messages body")
    assert "(no content blocks)" in text
