"""The mitmproxy skin: which flows to touch, per-flow state, the stream callable, options.

This is the only module that imports mitmproxy. Everything it calls is sans-IO.

Flow life cycle (live and offline `-r` flows fire the same hooks):
    requestheaders  pick the flow (POST .../chat/completions or .../responses, within
                    `toolshim_filter`) and ask upstream for an uncompressed body
    request         repair the request's history where its backend needs it (history.py,
                    with what the conversation state recalls; asynchronous when the state
                    is a shared server), then read the declared tools and the history
    responseheaders streamed 2xx SSE: install the stream callable, fix the framing headers
    response        streamed: keep the rewritten body for mitmweb / `-w`;
                    buffered or offline: rewrite the whole SSE or JSON body
    error           free the flow's state, keep what was sent
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import orjson
from mitmproxy import command, ctx, exceptions, flowfilter, http

from . import contentview
from .apis import MESSAGES, METADATA_KEY, RESPONSES, api_of
from .backends import REASONING, REPAIRS, RepairPolicy, backend_for
from .calls import RewriteStats
from .chat import ChatStreamRewriter, rewrite_chat_completion
from .emulation import EmulatedRequest, emulate_request
from .encoding import Decoder, identity, incremental_decoder
from .history import HistoryRepair
from .lexers import DIALECT_NAMES
from .messages import MessagesStreamRewriter, rewrite_messages_body
from .memory import ConversationState, KeyMaker, LocalStore, RedisStore, StoreUnreachable, turns_given_pieces
from .report import MARK_REWRITTEN, FlowOutcome, SessionCounters, request_comment, tally
from .responses import ResponsesStreamRewriter, rewrite_response_body
from .stream import NotedEvents, SseRewriter
from .tools import RequestContext

log = logging.getLogger(__name__)


def log_url(flow: http.HTTPFlow) -> str:
    """The flow's URL as the log names it (`LoggedUrl`)."""
    return str(LoggedUrl(flow.request))


class LoggedUrl:
    """A request's URL as the log names it: without the query, where clients may pass a key
    (`?api-key=…`, `?key=…`), which must not reach the log (tests/test_security.py). Worked
    out when a line is written (`%s`): a flow whose stream keeps one and logs nothing never
    pays for it (mitmproxy's `pretty_url` takes about 5 µs). It holds the request, not the
    flow: the flow holds the stream."""

    __slots__ = ("request",)

    def __init__(self, request: http.Request) -> None:
        self.request = request

    def __str__(self) -> str:
        return self.request.pretty_url.split("?", 1)[0]


def safe_url(url: str) -> str:
    """A store URL as the log may name it: without a password."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]).geturl()


def is_event_stream(headers: http.Headers) -> bool:
    return header(headers, b"content-type").lower().startswith("text/event-stream")


def header(headers: http.Headers, name: bytes) -> str:
    """`headers.get(name, "")` (`name` in lower case), read from the raw fields: mitmproxy's
    own lookups convert the name of every field, and the name asked for, on each call."""
    values = [value for key, value in headers.fields if key.lower() == name]
    return b", ".join(values).decode("utf-8", "surrogateescape") if values else ""


def frame_as_rewritten(headers: http.Headers, chunked: bool) -> None:
    """The framing headers of a body rewritten as it streams, set in one pass over the raw
    fields: no content-encoding (the body is decoded in flight) nor content-length (its length
    changes); with `chunked` (HTTP/1.1), `transfer-encoding: chunked` in place of upstream's."""
    fields: list[tuple[bytes, bytes]] = []
    placed = False
    for key, value in headers.fields:
        name = key.lower()
        if name == b"content-encoding" or name == b"content-length":
            continue
        if chunked and name == b"transfer-encoding":
            if placed:
                continue  # (as mitmproxy's `headers[name] = value`: the first one takes it)
            value, placed = b"chunked", True
        fields.append((key, value))
    if chunked and not placed:
        fields.append((b"transfer-encoding", b"chunked"))
    headers.fields = tuple(fields)


def is_json(headers: http.Headers) -> bool:
    media = header(headers, b"content-type").lower().split(";")[0].strip()
    return media == "application/json" or media.endswith("+json")


@dataclass(frozen=True, slots=True)
class TerminalEvent:
    """How the stream callable sees an API's terminal event among the bytes that go out: `needle`
    is a cheap test of every read, `framing` tells the event from a model's text that merely
    names it. JSON escapes every quote and line end inside a string, so `"type":"message_stop"`
    or a line that starts `data: [DONE]` can only be the event's own framing."""

    needle: bytes
    framing: re.Pattern[bytes]


# Chat's framing is searched with the byte sent before the read's output in front (a line end
# at the stream's start): the rewriter sends whole events, so `[DONE]` opens a line.
CHAT_TERMINAL = TerminalEvent(b"[DONE]", re.compile(rb"[\r\n]data: ?\[DONE\]"))
RESPONSES_TERMINAL = TerminalEvent(b"response.completed", re.compile(rb'"type"\s*:\s*"response\.completed"'))
MESSAGES_TERMINAL = TerminalEvent(b"message_stop", re.compile(rb'"type"\s*:\s*"message_stop"'))


class StreamRewrite:
    """The `flow.response.stream` callable of one flow.

    mitmproxy calls it on its event loop with each network read and once with b"" at the end.
    It must never raise (the chunk would be silently dropped) and never return b"" mid-stream
    (HTTP/1.1 would read it as the end of the body): it returns a list, possibly empty.
    """

    def __init__(
        self,
        rewriter: SseRewriter,
        decoder: Decoder,
        url: LoggedUrl | str,
        keep_upstream: bool,
        on_terminal: Callable[[list[bytes], NotedEvents | None], None] | None = None,
        terminal: TerminalEvent = CHAT_TERMINAL,
    ) -> None:
        self.rewriter: SseRewriter | None = rewriter
        self._stats: RewriteStats | None = None  # (the rewriter's, once it is let go: `finished`)
        self.decoder: Decoder | None = None if decoder is identity else decoder  # (None: no call a read)
        self.url = url
        self.keep_upstream = keep_upstream
        self.sent: list[bytes] = []  # what the client got: kept so mitmweb and -w can show it
        self.upstream: list[bytes] = []  # what upstream sent (decoded)
        self.failed = False
        # Called once with everything sent, when the terminal event has gone to the client: the
        # client may send its next request before mitmproxy's `response` hook fires.
        self.on_terminal = on_terminal
        self.terminal = terminal
        if on_terminal is not None:  # (the lanes note what they send: remembering takes it, not read again)
            rewriter.laned = NotedEvents()

    def __call__(self, data: bytes) -> list[bytes]:
        end = not data
        plain = data
        if self.decoder is not None:
            try:
                plain = self.decoder(data)
            except Exception as exc:  # broken compression: nothing sensible can be decoded
                self._fail(exc)
        if self.keep_upstream and plain:
            self.upstream.append(plain)
        if self.failed:
            out = [plain]
        else:
            try:
                out = self.rewriter.feed(plain) if plain else []
                if end:
                    out += self.rewriter.close()
                if self.rewriter.failure is not None:
                    self._fail(self.rewriter.failure)  # the core already passed the event on
                    if not end:  # from now on bytes pass as they come: the held tail goes first
                        out.append(self._pending_after_failure())
            except Exception as exc:  # the framing itself broke: forward what it held, as is
                self._fail(exc)
                out = [self._pending_after_failure()]
        # (Called for every network read: no comprehension or generator where a read is one piece.)
        if b"" in out:
            out = [piece for piece in out if piece]
        first = len(self.sent)
        self.sent.extend(out)  # (as the rewriter made them: remembering knows a lane's events by their identity)
        if len(out) > 1:
            out = [b"".join(out)]  # a read's events go out as one write
        if self.on_terminal is not None:
            # (`_carries_terminal`'s commonest answer, inline: no needle. `partition`, neither `in`
            # nor `find`: CPython 3.11's `bytes in bytes` first tries the needle as an integer,
            # and makes and clears a TypeError with a formatted message each time; `find` parses
            # its arguments from a format string. Without the needle, `partition` copies nothing.)
            if end or (out and out[0].partition(self.terminal.needle)[1] and self._carries_terminal(out[0], first)):
                self.terminal_reached()
        return out

    def _carries_terminal(self, written: bytes, first: int) -> bool:
        """Whether `written`, the read's output (already at the end of `sent`, from `first` on),
        holds the terminal event. A model that writes `[DONE]` or `message_stop` in its text must
        not have the turn remembered there: its later calls would be missing."""
        before = self.sent[first - 1][-1:] if first else b"\n"  # (rare: once a stream, or text naming the event)
        return self.terminal.framing.search(before + written) is not None

    def terminal_reached(self) -> None:
        """Hand what the client got to `on_terminal`, once (a stream cut short: at its end)."""
        callback, self.on_terminal = self.on_terminal, None
        if callback is not None:
            try:
                callback(self.sent, self.rewriter.laned)
            except Exception as exc:  # remembering is a nicety: never the stream's problem
                log.warning("toolshim: remembering the reasoning of %s failed (%r)", self.url, exc, exc_info=exc)

    def _fail(self, exc: Exception) -> None:
        if not self.failed:
            self.failed = True
            log.warning(
                "toolshim: rewriting %s failed (%r); the rest of the stream passes unchanged",
                self.url,
                exc,
                exc_info=exc,
            )

    def _pending_after_failure(self) -> bytes:
        try:
            return self.rewriter.take_pending()
        except Exception:
            return b""

    @property
    def stats(self) -> RewriteStats:
        return self.rewriter.stats if self.rewriter is not None else self._stats

    def release(self) -> None:
        """The flow is done. mitmproxy keeps `response.stream` alive as long as the flow, so let
        go of the body copies (they now live in the flow itself)."""
        self.terminal_reached()
        self.sent = []
        self.upstream = []
        if self.rewriter is not None:
            self.rewriter.laned = None  # (its notes hold what the client got)
        self.failed = True  # should mitmproxy call again, pass bytes through

    def finished(self) -> None:
        """The flow is done and annotated: `release`, and let go of the rewriter too. mitmproxy
        itself keeps a flow's response in a reference cycle (its dataclasses' type checks catch
        TypeErrors whose tracebacks hold the frames that made it), freed only when its garbage
        collector runs: what the response holds then is the collector's to find and free, a
        hundred objects a flow that would fill its youngest generation and wait for a full
        collection. Dropped here, they go by their reference counts."""
        self.release()
        if self.rewriter is not None:
            self._stats, self.rewriter = self.rewriter.stats, None


@dataclass(frozen=True, slots=True)
class FlowOptions:
    """The options the hooks of every flow read, taken when they change (`load`, `configure`):
    mitmproxy's `ctx.options.name` deep-copies the value on each read (a few microseconds,
    seven times a flow)."""

    enabled: bool
    max_held: int
    keep_upstream: bool
    reasoning_preopened: str
    reasoning_field: str
    extensions: bool
    parse_error_chunk: bool
    required_action: bool
    sign_thinking: bool
    reasoning_placeholder: str

    @classmethod
    def of(cls, options) -> FlowOptions:
        return cls(**{name: getattr(options, "toolshim_" + name) for name in cls.__dataclass_fields__})


@dataclass
class FlowState:
    """What toolshim keeps for one flow between its hooks."""

    api: str
    context: RequestContext = field(default_factory=RequestContext)
    stream: StreamRewrite | None = None
    emulated: EmulatedRequest | None = None  # tools emulated for a text-only backend
    # Set when the backend wants reasoning back: names the turns of the response to remember.
    remember: KeyMaker | None = None
    remember_all_turns: bool = False


class ToolShim:
    name = "toolshim"

    def __init__(self) -> None:
        self._flows: dict[str, FlowState] = {}
        self._filter: flowfilter.TFilter | None = None
        self._emulate: re.Pattern[str] | None = None
        self._dialects: tuple[str, ...] | None = None
        self._repair_policy = RepairPolicy()
        self.state = ConversationState(LocalStore(10_000, 64 << 20, 6 * 3600))
        self.counters = SessionCounters()
        self._options: FlowOptions | None = None  # (set in `load`)

    def load(self, loader) -> None:
        contentview.register()  # the "LLM stream" view for mitmweb and the console
        loader.add_option(
            "toolshim_enabled", bool, True, "Repair tool-call markup in LLM responses."
        )
        loader.add_option(
            "toolshim_filter",
            str,
            "",
            "A mitmproxy filter expression, evaluated on the request, that narrows which "
            "Chat Completions flows are repaired (for example '~d api.example.com & ~u /v1/'). "
            "Empty: every POST to a path ending in /chat/completions, /responses or /v1/messages.",
        )
        loader.add_option(
            "toolshim_max_held",
            int,
            1 << 20,
            "Most characters of markup one text channel may hold back (call headers, arguments "
            "kept to infer a tool name); past it the markup is released as visible text.",
        )
        loader.add_option(
            "toolshim_keep_upstream",
            bool,
            True,
            "Keep the original upstream body of a rewritten stream in flow.metadata['toolshim'].",
        )
        loader.add_option(
            "toolshim_emulate",
            str,
            "",
            "Emulate tool calling for backends without it: a regular expression searched in the "
            "request's model name and in its host. Matching requests go upstream without tools, "
            "with a tool manifest in the prompt and the history flattened to text; the answer's "
            "<tool_call> blocks become tool calls. Empty: emulate nothing.",
        )
        loader.add_option(
            "toolshim_dialects",
            str,
            "",
            "Comma-separated markup dialects to repair, forcing the choice (e.g. 'kimi,hermes'). "
            f"Known: {', '.join(DIALECT_NAMES)}. Empty: picked from the model name (a model the "
            "table does not know gets them all).",
        )
        loader.add_option(
            "toolshim_reasoning_preopened",
            str,
            "auto",
            "Does the output start inside a <think> block the chat template opened (DeepSeek "
            "V3.1+ and R1, GLM-4.5+, MiniMax-M2, Kimi K2-Thinking and K2.5, Qwen3 Thinking and "
            "3.5 when thinking is on)? 'auto': by the request (chat_template_kwargs, thinking, "
            "reasoning_effort) and the model name; 'yes'; 'no'.",
            choices=["auto", "yes", "no"],
        )
        loader.add_option(
            "toolshim_reasoning_field",
            str,
            "auto",
            "Chat Completions: the field reasoning found in content (<think>) goes to. 'auto': the "
            "one upstream uses in the stream, else reasoning_content.",
            choices=["auto", "reasoning_content", "reasoning"],
        )
        loader.add_option(
            "toolshim_extensions",
            bool,
            False,
            "Chat Completions, non-streaming: add seed 002's `extensions` (reasoning_chunks, "
            "tool_call_chunks) to the body. Not OpenAI wire format; strict clients may reject it.",
        )
        loader.add_option(
            "toolshim_parse_error_chunk",
            bool,
            False,
            "Chat Completions, streaming: when markup failed to parse as a call (invalid JSON, a "
            "strict tool's schema), end the choice with seed 002's `finish_reason: \"error\"` chunk "
            "and an `error` object. The markup is still sent as text. openai-python raises "
            "APIError on such a chunk: only for clients that expect it.",
        )
        loader.add_option(
            "toolshim_required_action",
            bool,
            False,
            "Responses API: send a `response.required_action` event (seed 004's gateway dialect, "
            "not an OpenAI event) before `response.completed` when calls were made. Strict "
            "clients and openai-node reject it: turn it on only for clients that wait for it.",
        )

        loader.add_option(
            "toolshim_sign_thinking",
            bool,
            True,
            "Anthropic Messages: a thinking block that ends without a signature (one toolshim "
            "made from <think>, or upstream's unsigned one) gets an empty signature_delta; "
            "Claude Code drops unsigned thinking. Signatures are never invented otherwise.",
        )
        loader.add_option(
            "toolshim_request_repairs",
            str,
            "auto",
            "Which request repairs to make: 'auto' (by the backend table, from the model name), "
            "'off' (none), or comma-separated terms: 'auto', repair names (made for every model) "
            f"and '-name' (never made). Repairs: {', '.join(REPAIRS)}.",
        )
        loader.add_option(
            "toolshim_reasoning_placeholder",
            str,
            "",
            "Text to put in an assistant turn whose reasoning the backend needs and the state "
            "does not hold (restart, evicted, another worker). Empty: leave the turn as it is "
            "(some gateways reject placeholders).",
        )
        loader.add_option(
            "toolshim_state",
            str,
            "",
            "Where the conversation state lives (the reasoning the client was sent, by tool "
            "call). Empty: in this process. redis://HOST:PORT/DB (or rediss://): a Redis or "
            "Valkey server shared by several mitmdump workers.",
        )
        loader.add_option(
            "toolshim_state_timeout",
            int,
            250,
            "Most milliseconds a request waits on a shared state server; past it the request "
            "goes as the client sent it.",
        )
        loader.add_option(
            "toolshim_state_max_entries", int, 10_000, "In-process state: most entries kept (least recently used go first)."
        )
        loader.add_option(
            "toolshim_state_max_bytes", int, 64 << 20, "In-process state: most bytes of values kept; also the largest value stored."
        )
        loader.add_option(
            "toolshim_state_ttl", int, 6 * 3600, "Seconds an entry of the state is kept (in-process and shared)."
        )
        self._options = FlowOptions.of(loader.master.options)

    def configure(self, updated: set[str]) -> None:
        if "toolshim_filter" in updated:
            expression = ctx.options.toolshim_filter.strip()
            if expression:
                try:
                    self._filter = flowfilter.parse(expression)
                except ValueError as exc:
                    raise exceptions.OptionsError(f"toolshim_filter: invalid filter expression: {exc}") from exc
            else:
                self._filter = None
        if "toolshim_emulate" in updated:
            pattern = ctx.options.toolshim_emulate
            try:
                self._emulate = re.compile(pattern) if pattern else None
            except re.error as exc:
                raise exceptions.OptionsError(f"toolshim_emulate: invalid regular expression: {exc}") from exc
        if "toolshim_dialects" in updated:
            names = tuple(n.strip() for n in ctx.options.toolshim_dialects.split(",") if n.strip())
            unknown = [n for n in names if n not in DIALECT_NAMES]
            if unknown:
                raise exceptions.OptionsError(f"toolshim_dialects: unknown dialect(s) {unknown}; known: {list(DIALECT_NAMES)}")
            self._dialects = names or None
        if "toolshim_max_held" in updated and ctx.options.toolshim_max_held < 1024:
            raise exceptions.OptionsError("toolshim_max_held must be at least 1024 characters")
        # mitmproxy lists `choices` in its help, but does not refuse others set with --set.
        for name, allowed in (("toolshim_reasoning_preopened", ("auto", "yes", "no")), ("toolshim_reasoning_field", ("auto", "reasoning_content", "reasoning"))):
            if name in updated and getattr(ctx.options, name) not in allowed:
                raise exceptions.OptionsError(f"{name}: {getattr(ctx.options, name)!r} is not one of {', '.join(allowed)}")
        if "toolshim_request_repairs" in updated:
            try:
                self._repair_policy = RepairPolicy.parse(ctx.options.toolshim_request_repairs)
            except ValueError as exc:
                raise exceptions.OptionsError(f"toolshim_request_repairs: {exc}") from exc
        state_options = {"toolshim_state", "toolshim_state_timeout", "toolshim_state_max_entries", "toolshim_state_max_bytes", "toolshim_state_ttl"}
        if updated & state_options:
            self.state = ConversationState(self._make_store())
        self._options = FlowOptions.of(ctx.options)  # (a value refused above is rolled back: configured again)

    def _make_store(self) -> LocalStore | RedisStore:
        options = ctx.options
        for name in ("toolshim_state_timeout", "toolshim_state_max_entries", "toolshim_state_max_bytes", "toolshim_state_ttl"):
            if getattr(options, name) < 1:
                raise exceptions.OptionsError(f"{name} must be at least 1")
        url = options.toolshim_state.strip()
        if not url:
            return LocalStore(options.toolshim_state_max_entries, options.toolshim_state_max_bytes, options.toolshim_state_ttl)
        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss"):
            raise exceptions.OptionsError(f"toolshim_state: {safe_url(url)!r} is not a redis:// or rediss:// URL")
        try:
            parts.port  # noqa: B018 (parsing it is the check)
        except ValueError:
            raise exceptions.OptionsError(f"toolshim_state: {safe_url(url)!r}: the port is not a number") from None
        if not re.fullmatch(r"/?\d*", parts.path):
            raise exceptions.OptionsError(f"toolshim_state: {safe_url(url)!r}: the database is not a number (redis://HOST:PORT/DB)")
        try:
            store = RedisStore(url, options.toolshim_state_ttl, options.toolshim_state_timeout / 1000, options.toolshim_state_max_bytes)
        except ImportError as exc:
            raise exceptions.OptionsError("toolshim_state: a shared store needs the redis package (pip install redis)") from exc
        except ValueError as exc:
            raise exceptions.OptionsError(f"toolshim_state: {safe_url(url)!r}: {exc}") from exc
        log.info("toolshim: conversation state in %s", safe_url(url))
        return store

    @command.command("toolshim.stats")
    def stats(self) -> str:
        """What toolshim repaired since mitmproxy started: flows, calls, and a table of
        counters per dialect and category (LeakedMarkup, InvalidJson, UnknownName,
        SchemaMismatch, BrokenStreamShape, NotAllowed)."""
        self.counters.state_unreachable = self.state.unreachable
        text = self.counters.render()
        log.info("%s", text)
        return text

    def done(self) -> None:
        self.counters.state_unreachable = self.state.unreachable
        log.info("%s", self.counters.summary_line())
        contentview.unregister()  # a reloaded script registers it again

    # -- hooks -----------------------------------------------------------------------------------

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        api = api_of(flow)
        if not self._options.enabled or api is None:
            return
        if self._filter is not None and not self._filter(flow):
            return
        if METADATA_KEY in flow.metadata:
            return  # rewritten before (a live capture replayed offline): never twice
        self._flows[flow.id] = FlowState(api)
        self.counters.count_flow(api)
        if flow.live:
            flow.request.headers["accept-encoding"] = "identity"

    def request(self, flow: http.HTTPFlow):
        state = self._flows.get(flow.id)
        if state is None:
            return None
        try:
            request = orjson.loads(flow.request.get_content(strict=False) or b"null")
        except Exception as exc:  # an unreadable request only means: no tools known
            log.info("toolshim: could not read the request body of %s: %s", log_url(flow), exc)
            return None
        repair = self._history_repair(flow, state, request)
        if repair is not None and self.state.shared and repair.wanted_keys():
            return self._request_after_lookup(flow, state, request, repair)  # mitmproxy awaits it
        found = self.state.get_local(repair.wanted_keys()) if repair is not None else {}
        self._finish_request(flow, state, request, repair, found)
        return None

    async def _request_after_lookup(self, flow: http.HTTPFlow, state: FlowState, request: dict, repair: HistoryRepair) -> None:
        found, failure = await self.state.get_shared(repair.wanted_keys())
        if failure is not None:
            log.warning("toolshim: state store unreachable (%s); requests go as the clients sent them until it answers", failure)
        self._finish_request(flow, state, request, repair, found)

    def _history_repair(self, flow: http.HTTPFlow, state: FlowState, request: object) -> HistoryRepair | None:
        """The repairs this request's backend needs (None: none; the request stays byte for byte).
        Captured requests read offline are history: never changed."""
        if not flow.live or not isinstance(request, dict):
            return None
        model = request.get("model") if isinstance(request.get("model"), str) else ""
        backend = backend_for(model)
        repairs = self._repair_policy.repairs_for(backend)
        if not repairs:
            return None
        keys = KeyMaker.for_request(request, flow.request.headers) if REASONING in repairs else None
        if keys is not None:
            state.remember = keys
            state.remember_all_turns = backend.reasoning_turns == "all_turns"
        return HistoryRepair(request, state.api, repairs, backend, keys)

    def _finish_request(self, flow: http.HTTPFlow, state: FlowState, request: object, repair: HistoryRepair | None, found: dict) -> None:
        if repair is not None:
            original = flow.request.content
            try:
                if repair.apply(found, self._options.reasoning_placeholder):
                    flow.request.content = orjson.dumps(request)  # content-length follows
                self._annotate_request(flow, repair, original)
            except Exception as exc:  # fail open: the request goes as the client sent it
                log.warning("toolshim: repairing the request of %s failed (%r); sent unchanged", log_url(flow), exc, exc_info=exc)
                flow.request.content = original
                request = orjson.loads(original)
        state.context = self._with_options(RequestContext.from_request(request))
        if self._emulates(flow, request):
            try:
                state.emulated = emulate_request(request, state.api)
            except Exception as exc:  # fail open: the request goes as the client sent it
                log.warning("toolshim: emulating tools for %s failed (%r); sent unchanged", log_url(flow), exc, exc_info=exc)
                return
            flow.request.content = orjson.dumps(state.emulated.body)  # content-length follows
            state.context = self._with_options(state.emulated.context)
            log.info("toolshim: emulating tools for %s: %s", log_url(flow), state.emulated.telemetry())

    def _annotate_request(self, flow: http.HTTPFlow, repair: HistoryRepair, original: bytes) -> None:
        """The request's repairs and misses, where people look (as `_annotate` for responses)."""
        self.counters.add_request(repair.changes, len(repair.misses))
        if not repair.changes and not repair.misses:
            return
        info: dict = {"repairs": repair.changes}
        if repair.misses:
            info["reasoning_missing"] = repair.misses
            log.info("toolshim: %s: no reasoning known for %s (not restored)", log_url(flow), ", ".join(repair.misses))
        if repair.changes:
            log.info("toolshim: %s: request repaired: %s", log_url(flow), request_comment(repair.changes, []))
            if self._options.keep_upstream:
                info["original"] = original
        flow.metadata.setdefault(METADATA_KEY, {})["request"] = info
        comment = "toolshim: request: " + request_comment(repair.changes, repair.misses)
        flow.comment = f"{flow.comment}\n{comment}" if flow.comment else comment
        if not flow.marked and repair.changes:
            flow.marked = MARK_REWRITTEN

    def _with_options(self, context: RequestContext) -> RequestContext:
        context.dialects = self._dialects
        options = self._options
        if options.reasoning_preopened != "auto":  # else what the request and the model say (RequestContext)
            context.reasoning_preopened = options.reasoning_preopened == "yes"
        context.reasoning_field = None if options.reasoning_field == "auto" else options.reasoning_field
        context.extensions = options.extensions
        context.parse_error_chunk = options.parse_error_chunk
        return context

    def _emulates(self, flow: http.HTTPFlow, request: object) -> bool:
        """Live requests whose model or host matches `toolshim_emulate` (offline flows were sent
        long ago: their requests are history)."""
        if self._emulate is None or not flow.live or not isinstance(request, dict):
            return False
        model = request.get("model")
        return bool(
            (isinstance(model, str) and self._emulate.search(model)) or self._emulate.search(flow.request.pretty_host)
        )

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        state = self._flows.get(flow.id)
        response = flow.response
        if state is None or response is None:
            return
        if not (200 <= response.status_code < 300):
            self._flows.pop(flow.id, None)  # error answers pass untouched
            return
        if not flow.live or not is_event_stream(response.headers) or response.raw_content is not None:
            # Offline flows, JSON bodies, and answers another addon set whole in `request`
            # (server replay, map_local: nothing will stream) are rewritten whole in `response`.
            return
        encoding = header(response.headers, b"content-encoding")
        decoder = incremental_decoder(encoding)
        if decoder is None:
            log.warning("toolshim: %s is %s-encoded, which cannot be decoded in flight; passing it through", log_url(flow), encoding)
            self._flows.pop(flow.id, None)
            response.stream = True
            return
        frame_as_rewritten(response.headers, chunked=flow.request.http_version == "HTTP/1.1")
        rewriter = self._stream_rewriter(state)
        state.stream = StreamRewrite(
            rewriter,
            decoder,
            LoggedUrl(flow.request),
            self._options.keep_upstream,
            on_terminal=self._remembering(flow, state),
            terminal={RESPONSES: RESPONSES_TERMINAL, MESSAGES: MESSAGES_TERMINAL}.get(state.api, CHAT_TERMINAL),
        )
        response.stream = state.stream

    def response(self, flow: http.HTTPFlow) -> None:
        state = self._flows.pop(flow.id, None)
        if state is None or flow.response is None:
            return
        try:
            if state.stream is not None:
                self._keep_streamed_body(flow, state)
            else:
                self._rewrite_whole_body(flow, state)
        except Exception as exc:  # fail open: the flow stays as it was
            log.warning("toolshim: rewriting %s failed (%s); left unchanged", log_url(flow), exc, exc_info=True)

    def error(self, flow: http.HTTPFlow) -> None:
        state = self._flows.pop(flow.id, None)
        if state is not None and state.stream is not None and flow.response is not None:
            self._keep_streamed_body(flow, state)

    # -- helpers ---------------------------------------------------------------------------------

    def _keep_streamed_body(self, flow: http.HTTPFlow, state: FlowState) -> None:
        stream = state.stream
        if flow.response.raw_content is None:  # mitmproxy 11 keeps no streamed body
            flow.response.raw_content = b"".join(stream.sent)
        changed = stream.rewriter.changed or stream.failed  # after a failure: compare no more
        upstream = b"".join(stream.upstream) if stream.keep_upstream and changed else None
        self._annotate(flow, state, stream.stats, changed=changed, upstream=upstream, failed=stream.failed)
        stream.finished()

    def _remembering(self, flow: http.HTTPFlow, state: FlowState) -> Callable[[list[bytes], NotedEvents | None], None] | None:
        """What keeps the reasoning the client is given, for the backends that want it back."""
        keys = state.remember
        if keys is None or not flow.live:
            return None
        url = LoggedUrl(flow.request)

        def remember(sent: list[bytes], noted: NotedEvents | None) -> None:
            records: dict[str, bytes] = {}
            for turn in turns_given_pieces(state.api, sent, noted):
                records.update(turn.records(keys, state.remember_all_turns))
            self.state.put(records, lambda failure: log.warning("toolshim: state store unreachable (%s); the reasoning of %s is not kept", failure, url))

        return remember

    def _stream_rewriter(self, state: FlowState) -> SseRewriter:
        options = self._options
        if state.api == MESSAGES:
            return MessagesStreamRewriter(state.context, max_held=options.max_held, sign_thinking=options.sign_thinking)
        if state.api == RESPONSES:
            return ResponsesStreamRewriter(state.context, max_held=options.max_held, required_action=options.required_action)
        return ChatStreamRewriter(state.context, max_held=options.max_held)

    def _rewrite_whole_body(self, flow: http.HTTPFlow, state: FlowState) -> None:
        response = flow.response
        if not (200 <= response.status_code < 300) or not response.raw_content:
            return
        body = response.get_content(strict=False)
        if body is None:
            return
        if is_event_stream(response.headers):
            rewriter = self._stream_rewriter(state)
            new_body = b"".join([*rewriter.feed(body), *rewriter.close()])
            stats = rewriter.stats
            # A body only re-cut (a `<` held and sent with the next event) stays as it came.
            changed = new_body != body and (rewriter.changed or rewriter.failure is not None)
        elif is_json(response.headers):
            try:
                parsed = orjson.loads(body)
            except orjson.JSONDecodeError:
                log.info("toolshim: %s answered with a JSON content type but no JSON; left unchanged", log_url(flow))
                return
            if not isinstance(parsed, dict):
                return
            stats = RewriteStats()
            if state.api == MESSAGES:
                rewritten = rewrite_messages_body(parsed, state.context, max_held=self._options.max_held, stats=stats, sign_thinking=self._options.sign_thinking)
            else:
                rewrite_body = rewrite_response_body if state.api == RESPONSES else rewrite_chat_completion
                rewritten = rewrite_body(parsed, state.context, max_held=self._options.max_held, stats=stats)
            changed = rewritten is not None
            new_body = orjson.dumps(parsed) if changed else body
        else:
            return
        if changed:
            response.content = new_body  # re-encodes to the flow's content-encoding
        if (remember := self._remembering(flow, state)) is not None:
            remember([new_body], None)
        upstream = body if changed and self._options.keep_upstream else None
        self._annotate(flow, state, stats, changed=changed, upstream=upstream, failed=False)

    def _annotate(
        self, flow: http.HTTPFlow, state: FlowState, stats: RewriteStats, *, changed: bool, upstream: bytes | None, failed: bool
    ) -> None:
        """Say what happened, where people look: the flow's comment and mark (mitmweb's list),
        `flow.metadata["toolshim"]` (saved with the flow), the log, the session's counters."""
        emulated = state.emulated
        outcome = FlowOutcome(
            stats,
            changed=changed,
            emulated=emulated is not None,
            # A proxy cannot ask again without holding the whole answer back: the text answer
            # goes to the client as it is, and the flow says what happened.
            required_call_missing=emulated is not None and emulated.requires_call and not stats.calls,
            failed=failed,
        )
        self.counters.add(outcome)
        for note in stats.notes:
            log.info("toolshim: %s: %s", log_url(flow), note)
        if emulated is not None:
            log.info("toolshim: emulated tools for %s: %s; %s", log_url(flow), outcome.comment(), emulated.telemetry())
        if outcome.required_call_missing:
            log.warning("toolshim: %s: tool_choice demanded a call, the emulated backend answered without one", log_url(flow))
        if not outcome.worth_noting:
            return
        info: dict = {"calls": stats.calls, "names": list(stats.names), "tally": tally(stats)}
        if emulated is not None:
            info["emulated"] = emulated.telemetry()
        if outcome.required_call_missing:
            info["required_call_missing"] = True
        if stats.problems:
            info["problems"] = dict(stats.problems)
        if stats.stream_repairs:
            info["stream_repairs"] = dict(stats.stream_repairs)
        if failed:
            info["failed"] = True
        if upstream is not None:
            info["upstream"] = upstream
        flow.metadata[METADATA_KEY] = {**flow.metadata.get(METADATA_KEY, {}), **info}  # after the request's
        comment = outcome.comment()
        flow.comment = f"{flow.comment}\n{comment}" if flow.comment else comment
        if not flow.marked:  # a user's own mark wins
            flow.marked = outcome.mark()

