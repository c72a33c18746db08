"""What toolshim tells people: flow comments and marks, the counters, `toolshim.stats`, the
shutdown line. The texts are the interface (people read them in mitmweb's flow list), so they are
spelled out here in full."""

from __future__ import annotations

import logging

from mitmproxy.test import taddons

from harness import sse_body
from kimi import SEED_000, kimi_chunks
from test_addon import chat_flow, run_stream
from toolshim.addon import ToolShim
from toolshim.calls import INVALID_JSON, NOT_ALLOWED, REPAIRED_JSON, UNKNOWN_NAME, RewriteStats
from toolshim.report import FlowOutcome, SessionCounters, tally


def stats_with(calls=(), problems=(), repairs=(), reasoning_moved=0) -> RewriteStats:
    """`calls`: (dialect, name) pairs; `problems`: (dialect, problem) pairs."""
    stats = RewriteStats()
    for dialect, name in calls:
        stats.calls += 1
        stats.names.append(name)
        stats.dialect_calls[dialect] += 1
    for dialect, problem in problems:
        stats.note(problem, "detail", dialect)
    for kind in repairs:
        stats.stream_repairs[kind] += 1
    stats.reasoning_moved = reasoning_moved
    return stats


def test_comment_names_the_dialect_the_calls_and_their_tools():
    stats = stats_with(calls=[("kimi", "bash"), ("kimi", "bash"), ("kimi", "read_file")])
    outcome = FlowOutcome(stats, changed=True)
    assert outcome.comment() == "toolshim: kimi → 3 calls (bash ×2, read_file)"
    assert outcome.mark() == ":wrench:"


def test_comment_lists_repairs_and_what_stayed_text():
    stats = stats_with(
        calls=[("hermes", "get_weather")],
        problems=[("hermes", REPAIRED_JSON), ("hermes", UNKNOWN_NAME), ("hermes", UNKNOWN_NAME), ("hermes", INVALID_JSON)],
    )
    outcome = FlowOutcome(stats, changed=True)
    assert outcome.comment() == (
        "toolshim: hermes → 1 call (get_weather) · repaired: JSON repaired ×1"
        " · left as text: invalid JSON ×1, unknown tool ×2"
    )
    assert outcome.mark() == ":warning:", "markup the client saw as text needs a look"


def test_comment_of_a_repaired_native_stream_and_of_moved_reasoning():
    stats = stats_with(repairs=["snapshot", "snapshot", "missing_index"], reasoning_moved=12)
    assert FlowOutcome(stats, changed=True).comment() == (
        "toolshim: no call from markup · repaired: upstream's own calls (snapshot ×2, missing_index),"
        " reasoning split from content"
    )


def test_comment_of_failures_and_emulation():
    outcome = FlowOutcome(stats_with(), changed=False, emulated=True, required_call_missing=True, failed=True)
    assert outcome.comment() == (
        "toolshim: no call from markup · tools emulated · required call missing · rewrite failed, the rest passed unchanged"
    )
    assert outcome.mark() == ":warning:"


def test_a_flow_with_nothing_to_say_gets_nothing():
    outcome = FlowOutcome(stats_with(), changed=False)
    assert not outcome.worth_noting and outcome.mark() == ""
    assert FlowOutcome(stats_with(problems=[("kimi", UNKNOWN_NAME)]), changed=False).worth_noting


def test_tally_groups_problems_into_categories_per_dialect():
    stats = stats_with(
        calls=[("kimi", "a"), ("hermes", "b")],
        problems=[("hermes", REPAIRED_JSON), ("hermes", INVALID_JSON), ("hermes", NOT_ALLOWED), ("", UNKNOWN_NAME)],
        repairs=["snapshot", "dropped"],
    )
    assert tally(stats) == {
        "kimi": {"LeakedMarkup": 1},
        "hermes": {"LeakedMarkup": 1, "InvalidJson": 2, "NotAllowed": 1},
        "unknown": {"UnknownName": 1},
        "native": {"BrokenStreamShape": 2},
    }


def test_session_counters_table_and_summary_line():
    counters = SessionCounters()
    for _ in range(3):
        counters.count_flow("chat")
    counters.count_flow("responses")
    counters.add(FlowOutcome(stats_with(calls=[("kimi", "bash"), ("kimi", "bash")]), changed=True))
    counters.add(FlowOutcome(stats_with(calls=[("hermes", "f")], problems=[("hermes", REPAIRED_JSON)]), changed=True))
    counters.add(FlowOutcome(stats_with(problems=[("hermes", UNKNOWN_NAME)]), changed=False, failed=True))
    assert counters.summary_line() == (
        "toolshim: 4 LLM flows, 2 rewritten, 3 calls from markup, 1 failed; LeakedMarkup 3, InvalidJson 1, UnknownName 1"
    )
    assert counters.render().splitlines() == [
        counters.summary_line(),
        "flows by API: chat 3, responses 1",
        "dialect  LeakedMarkup  InvalidJson  UnknownName  SchemaMismatch  BrokenStreamShape  NotAllowed",
        "hermes              1            1            1               0                  0           0",
        "kimi                2            0            0               0                  0           0",
    ]


def test_empty_session():
    assert SessionCounters().render().splitlines() == [
        "toolshim: 0 LLM flows, 0 rewritten, 0 calls from markup, 0 failed",
        "flows by API: none yet",
        "nothing repaired or noted yet",
    ]


def test_stats_command_and_shutdown_line_count_the_flows_the_addon_saw(caplog):
    addon = ToolShim()
    with taddons.context(addon) as tctx:
        run_stream(addon, chat_flow(), [sse_body(kimi_chunks("k2", SEED_000))])
        plain = chat_flow()
        run_stream(addon, plain, [sse_body([{"choices": [{"index": 0, "delta": {"content": "hi"}}]}])])
        assert "toolshim" not in plain.metadata and plain.comment == "" and plain.marked == ""
        text = tctx.master.commands.execute("toolshim.stats")
        assert text.splitlines()[0] == "toolshim: 2 LLM flows, 1 rewritten, 2 calls from markup, 0 failed; LeakedMarkup 2"
        assert text.splitlines()[-1].split() == ["kimi", "2", "0", "0", "0", "0", "0"]
        with caplog.at_level(logging.INFO):
            addon.done()
        assert "toolshim: 2 LLM flows, 1 rewritten, 2 calls from markup, 0 failed; LeakedMarkup 2" in caplog.text


def test_a_rewritten_stream_is_commented_and_marked_but_a_users_mark_and_comment_stay():
    addon = ToolShim()
    with taddons.context(addon):
        flow = chat_flow()
        run_stream(addon, flow, [sse_body(kimi_chunks("k2", SEED_000))])
        assert flow.comment == "toolshim: kimi → 2 calls (bash, read_file)"
        assert flow.marked == ":wrench:"
        assert flow.metadata["toolshim"]["tally"] == {"kimi": {"LeakedMarkup": 2}}

        mine = chat_flow()
        mine.comment, mine.marked = "look at this one", ":star:"
        run_stream(addon, mine, [sse_body(kimi_chunks("k2", SEED_000))])
        assert mine.comment == "look at this one\ntoolshim: kimi → 2 calls (bash, read_file)"
        assert mine.marked == ":star:"


# -- "rewritten or not": the byte comparison a flow's annotation rests on ----------------------


def feed_in_pieces(rewriter, body: bytes, size: int) -> bytes:
    out = []
    for start in range(0, len(body), size):
        out += rewriter.feed(body[start : start + size])
    return b"".join(out + rewriter.close())


def test_a_stream_passed_as_it_came_is_not_changed_however_it_is_cut():
    from responses import responses_events, responses_sse

    from toolshim.chat import ChatStreamRewriter
    from toolshim.responses import ResponsesStreamRewriter
    from toolshim.tools import RequestContext

    chat = sse_body([{"choices": [{"index": 0, "delta": {"content": p}}]} for p in ("a < b", " and ", "<tool")])
    responses = responses_sse(responses_events("qwen3", ["Hello", " <tool", " world"]))
    for body, make in ((chat, ChatStreamRewriter), (responses, ResponsesStreamRewriter)):
        for size in (1, 7, len(body)):
            rewriter = make(RequestContext.from_body(b'{"model": "qwen3", "tools": []}'))
            assert feed_in_pieces(rewriter, body, size) == body
            assert not rewriter.changed, (make.__name__, size)


def test_a_stream_with_markup_turned_into_calls_is_changed():
    from toolshim.chat import ChatStreamRewriter
    from toolshim.tools import RequestContext

    body = sse_body(kimi_chunks("k2", SEED_000))
    rewriter = ChatStreamRewriter(RequestContext.from_body(b'{"model": "k2"}'))
    assert feed_in_pieces(rewriter, body, 5) != body
    assert rewriter.changed


def test_an_event_placed_by_a_list_counts_as_changed_without_failing_the_rewrite():
    """Found by a helper: an `item_id` that is a list made the echo check raise once the bytes
    had parted; the rewrite then failed open. Now it only decides `changed`."""
    from responses import responses_events, responses_sse

    from toolshim.responses import ResponsesStreamRewriter
    from toolshim.tools import RequestContext

    events = responses_events("qwen3", ["Hi <", "tool"])
    odd = {"type": "response.refusal.delta", "item_id": [1], "output_index": 0, "content_index": 0, "delta": "no"}
    body = responses_sse(events[:-1] + [odd] + events[-1:])
    rewriter = ResponsesStreamRewriter(RequestContext.from_body(b'{"model": "qwen3", "tools": [{"type": "function", "name": "f"}]}'))
    out = feed_in_pieces(rewriter, body, len(body))
    assert rewriter.failure is None
    assert b'"item_id":[1]' in out and rewriter.changed
