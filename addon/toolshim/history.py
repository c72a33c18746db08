"""Request repairs: the history a backend needs, restored where the client dropped or mangled it.

A pure function of (request, backend facts, what the state recalls) -> request, in two steps so
the state can be asked once, over the network if need be, between them:

    repair = HistoryRepair(request, api, repairs, backend, keys)   # reads; knows what to look up
    found = store.get_many(repair.wanted_keys())                   # the caller's I/O
    repair.apply(found)                                            # changes `request` in place

Every change is recorded (`changes`: what, where, as plain data for flow.metadata), a turn
whose reasoning could not be found is counted (`misses`), and a second pass over a repaired
request changes nothing. Positions name the client's request (`messages[3]`, `input[5]`).
Whatever is not certain is left as it came: a tool result for an id no call has, non-text parts
in a tool result, a call without a name.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from .apis import MESSAGES, RESPONSES
from .backends import (
    ALL_TURNS,
    DEVELOPER_ROLE,
    KIMI_IDS,
    ORPHAN_RESULTS,
    REASONING,
    STRIP_PARALLEL,
    STRIP_STRICT,
    TOOL_CONTENT,
    Backend,
)
from .memory import CHAT_REASONING_FIELDS, KeyMaker, message_text

KIMI_ID = re.compile(r"functions\.([^:\s]+):(\d+)")
NO_RESULT = "no result was returned"
_TEXT_PARTS = ("text", "input_text", "output_text")


# An assistant turn that came back without its reasoning: (the client's position: Chat, the
# message; Responses, the turn's first item; that message or item (Responses: the reasoning goes
# before it); the keys it may be remembered by). A tuple: a long history has many.
_LostTurn = tuple[int, dict[str, Any], list[str]]


@dataclass
class HistoryRepair:
    request: dict[str, Any]
    api: str
    repairs: frozenset[str]
    backend: Backend
    keys: KeyMaker | None = None
    changes: list[dict[str, Any]] = field(default_factory=list)
    misses: list[str] = field(default_factory=list)  # where reasoning was wanted and not found
    _lost: list[_LostTurn] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._items_key = "input" if self.api == RESPONSES else "messages"
        if REASONING in self.repairs and self.keys is not None:
            find = {RESPONSES: self._lost_responses_turns, MESSAGES: self._lost_messages_turns}.get(self.api, self._lost_chat_turns)
            self._lost = find()

    @property
    def items(self) -> list[Any]:
        items = self.request.get(self._items_key)
        return items if isinstance(items, list) else []

    def wanted_keys(self) -> list[str]:
        """The state entries the reasoning repair would read (none when nothing is lost)."""
        return [key for _, _, keys in self._lost for key in keys]

    def apply(self, found: Mapping[str, Any], placeholder: str = "") -> bool:
        """Make every repair; returns whether the request changed."""
        if self.repairs & {TOOL_CONTENT, DEVELOPER_ROLE} and self.api != MESSAGES:  # neither applies there
            self._message_hygiene(TOOL_CONTENT in self.repairs, DEVELOPER_ROLE in self.repairs)
        if STRIP_STRICT in self.repairs:
            self._strip_strict()
        if STRIP_PARALLEL in self.repairs and "parallel_tool_calls" in self.request:
            del self.request["parallel_tool_calls"]
            self._changed(STRIP_PARALLEL, "parallel_tool_calls")
        links = _link(self.items, self.api) if self.repairs & {ORPHAN_RESULTS, KIMI_IDS} else None
        orphans = self._orphans(links) if ORPHAN_RESULTS in self.repairs else []
        if KIMI_IDS in self.repairs:
            self._kimi_ids(links)
        id_field = "call_id" if self.api == RESPONSES else "id"
        for after, holder in reversed(orphans):  # from the end: earlier positions stay valid
            call_id = holder[id_field]  # as renamed
            if self.api == MESSAGES:
                self._add_messages_result(after, call_id)
            else:
                self.items.insert(after + 1, self._synthetic_result(call_id))
            self._changed(ORPHAN_RESULTS, f"{self._items_key}[{after}]", call_id=call_id)
        if self._lost:  # last: Responses reasoning is inserted, found by identity, not position
            self._restore_reasoning(found, placeholder)
        return bool(self.changes)

    def _changed(self, repair: str, at: str, **detail: Any) -> None:
        self.changes.append({"repair": repair, "at": at, **detail})

    # -- reasoning --------------------------------------------------------------------------------

    def _lost_chat_turns(self) -> list[_LostTurn]:
        all_turns = self.backend.reasoning_turns == ALL_TURNS
        key_of_call = self.keys.call
        lost = []
        for at, message in enumerate(self.items):
            if not isinstance(message, dict) or message.get("role") != "assistant":
                continue
            # A history of many turns is walked on every request: loops written out, no
            # generator or comprehension where a turn has one call.
            if not _CHAT_REASONING.isdisjoint(message) and _has_chat_reasoning(message):
                continue
            keys = []
            entries = message.get("tool_calls")
            if isinstance(entries, list):
                for call in entries:
                    if isinstance(call, dict):
                        function = call.get("function")
                        if isinstance(function, dict):
                            keys.append(key_of_call(call.get("id"), function.get("name"), function.get("arguments")))
                        else:
                            keys.append(key_of_call(call.get("id"), None, None))
            if not keys:
                if not all_turns:
                    continue
                text = message_text(message.get("content"))
                if not text.strip():
                    continue
                keys.append(self.keys.answer(text))
            lost.append((at, message, keys))
        return lost

    def _lost_responses_turns(self) -> list[_LostTurn]:
        """Responses history comes as items: a turn is the run of model items (reasoning,
        assistant message, function calls) between two of the client's (messages, results)."""
        all_turns = self.backend.reasoning_turns == ALL_TURNS
        lost = []
        for start, run in _model_runs(self.items):
            if any(item.get("type") == "reasoning" for item in run):
                continue
            calls = [item for item in run if item.get("type") == "function_call"]
            if calls:
                keys = [self.keys.call(item.get("call_id"), item.get("name"), item.get("arguments")) for item in calls]
            else:
                text = "".join(message_text(item.get("content")) for item in run if item.get("type", "message") == "message")
                if not (all_turns and text.strip()):
                    continue
                keys = [self.keys.answer(text)]
            lost.append((start, run[0], keys))
        return lost

    def _lost_messages_turns(self) -> list[_LostTurn]:
        """Anthropic: an assistant message's thinking is its content's `thinking` (or
        `redacted_thinking`) blocks; its calls are `tool_use` blocks."""
        all_turns = self.backend.reasoning_turns == ALL_TURNS
        lost = []
        for at, message in enumerate(self.items):
            if not isinstance(message, dict) or message.get("role") != "assistant":
                continue
            content = message.get("content")
            blocks = [block for block in content if isinstance(block, dict)] if isinstance(content, list) else []
            if any(block.get("type") in ("thinking", "redacted_thinking") for block in blocks):
                continue
            calls = [block for block in blocks if block.get("type") == "tool_use"]
            if calls:
                keys = [self.keys.call(block.get("id"), block.get("name"), block.get("input")) for block in calls]
            elif all_turns and message_text(content).strip():
                keys = [self.keys.answer(message_text(content))]
            else:
                continue
            lost.append((at, message, keys))
        return lost

    def _restore_reasoning(self, found: Mapping[str, Any], placeholder: str) -> None:
        where = self._items_key
        restored = []
        for at, item, keys in self._lost:
            value = None
            for key in keys:
                if key in found:
                    value = found[key]
                    break
            try:  # the in-process store hands values decoded, a shared one as JSON bytes
                reasoning = orjson.loads(value) if isinstance(value, bytes) else value
            except orjson.JSONDecodeError:  # a store holding something else: as good as nothing
                reasoning = None
            if not isinstance(reasoning, dict):
                reasoning = None
            if reasoning is None:
                self.misses.append(f"{where}[{at}]")
                if not placeholder:
                    continue
                reasoning = self._placeholder(placeholder)
                self._changed(REASONING, f"{where}[{at}]", placeholder=True)
            else:
                self.changes.append({"repair": REASONING, "at": f"{where}[{at}]"})
            restored.append((item, reasoning))
        if self.api == MESSAGES:
            for message, reasoning in restored:
                blocks = [block for block in reasoning.get("blocks") or () if isinstance(block, dict)]
                content = message.get("content")
                message["content"] = blocks + (content if isinstance(content, list) else [{"type": "text", "text": content}])
            return
        if self.api != RESPONSES:
            for message, reasoning in restored:
                for name, value in reasoning.items():
                    if name in _CHAT_REASONING:
                        message[name] = value
            return
        position = {id(item): at for at, item in enumerate(self.items)}
        for first, reasoning in sorted(restored, key=lambda pair: position[id(pair[0])], reverse=True):
            at = position[id(first)]
            self.items[at:at] = [item for item in reasoning.get("items") or () if isinstance(item, dict)]

    def _placeholder(self, text: str) -> dict[str, Any]:
        if self.api == MESSAGES:
            return {"blocks": [{"type": "thinking", "thinking": text, "signature": ""}]}
        if self.api == RESPONSES:
            return {"items": [{"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": text}]}]}
        return {"reasoning_content": text}

    # -- hygiene ----------------------------------------------------------------------------------

    def _message_hygiene(self, tool_content: bool, developer_role: bool) -> None:
        """Tool results as plain text (parts flattened when all are text, missing content
        filled), and `developer` sent as `system`: one pass over the history."""
        chat = self.api != RESPONSES
        result_field = "content" if chat else "output"
        for at, item in enumerate(self.items):
            if not isinstance(item, dict):
                continue
            role = item.get("role")
            if developer_role and role == "developer":
                item["role"] = "system"
                self._changed(DEVELOPER_ROLE, f"{self._items_key}[{at}]")
            if not tool_content or (role != "tool" if chat else item.get("type") != "function_call_output"):
                continue
            value = item.get(result_field)
            if value is None:
                item[result_field] = ""
                self._changed(TOOL_CONTENT, f"{self._items_key}[{at}]", filled=True)
            elif isinstance(value, list) and all(_is_text_part(part) for part in value):
                item[result_field] = "\n".join(part["text"] for part in value)
                self._changed(TOOL_CONTENT, f"{self._items_key}[{at}]", flattened=len(value))

    def _strip_strict(self) -> None:
        tools = self.request.get("tools")
        for at, tool in enumerate(tools if isinstance(tools, list) else ()):
            spec = tool.get("function") if isinstance(tool, dict) and isinstance(tool.get("function"), dict) else tool
            if isinstance(spec, dict) and "strict" in spec:
                del spec["strict"]
                self._changed(STRIP_STRICT, f"tools[{at}]")

    def _orphans(self, links: _Links) -> list[tuple[int, dict[str, Any]]]:
        """(where the synthetic result goes after, the dict holding the call's id) for each call
        no result answers."""
        return [
            (self._end_of_results(at), holder)
            for at, _, holder, call_id, _ in links.calls
            if isinstance(call_id, str) and id(holder) not in links.answered
        ]

    def _add_messages_result(self, after: int, call_id: str) -> None:
        """Anthropic: results are `tool_result` blocks at the start of the next user message."""
        items = self.items
        result = {"type": "tool_result", "tool_use_id": call_id, "content": NO_RESULT}
        following = items[after + 1] if after + 1 < len(items) else None
        if isinstance(following, dict) and following.get("role") == "user":
            content = following.get("content")
            blocks = content if isinstance(content, list) else [{"type": "text", "text": content}] if isinstance(content, str) else []
            firsts = 0
            while firsts < len(blocks) and isinstance(blocks[firsts], dict) and blocks[firsts].get("type") == "tool_result":
                firsts += 1
            following["content"] = [*blocks[:firsts], result, *blocks[firsts:]]
        else:
            items.insert(after + 1, {"role": "user", "content": [result]})

    def _end_of_results(self, at: int) -> int:
        """The last item of the run of results (and, for Responses, further model items) after
        `at`; Anthropic: `at` itself (its results go into the next message)."""
        if self.api == MESSAGES:
            return at
        items, chat = self.items, self.api != RESPONSES
        end = at
        for later in range(at + 1, len(items)):
            item = items[later]
            if not isinstance(item, dict):
                break
            if chat and item.get("role") == "tool" or not chat and item.get("type") in ("function_call", "function_call_output", "reasoning"):
                end = later
            else:
                break
        return end

    def _synthetic_result(self, call_id: str) -> dict[str, Any]:
        if self.api == RESPONSES:
            return {"type": "function_call_output", "call_id": call_id, "output": NO_RESULT}
        return {"role": "tool", "tool_call_id": call_id, "content": NO_RESULT}

    def _kimi_ids(self, links: _Links) -> None:
        """Rename every call id not of Kimi's form to `functions.NAME:IDX`, IDX counting the
        conversation's calls in order of appearance (the next free number where that one is
        taken); each result follows the call it answers (`_link`)."""
        id_field, result_field = {RESPONSES: ("call_id", "call_id"), MESSAGES: ("id", "tool_use_id")}.get(self.api, ("id", "tool_call_id"))
        kimi_form = [False] * len(links.calls)
        taken = set()
        for index, (_, _, _, call_id, _) in enumerate(links.calls):
            if isinstance(call_id, str) and call_id.startswith("functions."):  # the regex only where it may match
                match = KIMI_ID.fullmatch(call_id)
                if match:
                    kimi_form[index] = True
                    taken.add(int(match.group(2)))
        next_free = max(taken, default=-1) + 1
        changes = self.changes  # appended to directly: a long history renames every call and result
        for index, (at, n, holder, call_id, name) in enumerate(links.calls):
            if kimi_form[index] or not isinstance(call_id, str) or not isinstance(name, str) or not name:
                continue
            if index in taken:
                index, next_free = next_free, next_free + 1
            taken.add(index)
            renamed = holder[id_field] = f"functions.{name}:{index}"
            changes.append({"repair": KIMI_IDS, "at": self._call_position(at, n), "id": renamed})
        for at, n, result in links.results:
            call = links.matched.get(id(result))
            if call is not None and result[result_field] != call[id_field]:
                renamed = result[result_field] = call[id_field]
                changes.append({"repair": KIMI_IDS, "at": f"{self._result_position(at, n)}.{result_field}", "id": renamed})

    def _call_position(self, at: int, n: int) -> str:
        if self.api == RESPONSES:
            return f"{self._items_key}[{at}]"
        if self.api == MESSAGES:
            return f"{self._items_key}[{at}].content[{n}]"
        return f"{self._items_key}[{at}].tool_calls[{n}]"

    def _result_position(self, at: int, n: int) -> str:
        if self.api == MESSAGES:
            return f"{self._items_key}[{at}].content[{n}]"
        return f"{self._items_key}[{at}]"


_CHAT_REASONING = frozenset(CHAT_REASONING_FIELDS)


def _has_chat_reasoning(message: dict[str, Any]) -> bool:
    for name in CHAT_REASONING_FIELDS:
        if message.get(name):
            return True
    return False


# A call: (the item, the entry of Chat's tool_calls or Messages' content, the dict holding its id,
# the id, the name). Tuples, not a class: a long history has a call in every other message.
_Call = tuple[int, int, dict[str, Any], Any, Any]


@dataclass(slots=True)
class _Links:
    calls: list[_Call]
    results: list[tuple[int, int, dict[str, Any]]]  # (item, Messages: block, the result) of results with a string id
    matched: dict[int, dict[str, Any]]  # id(result) -> the holder of the call it answers
    answered: set[int]  # id(holder) of the calls some result answers


def _link(items: list[Any], api: str) -> _Links:
    """The calls and results of a history, and which call each result answers: the earliest
    call before it with its id that no result answered yet, else (a result repeated) the
    latest call with its id."""
    calls: list[_Call] = []
    results: list[tuple[int, int, dict[str, Any]]] = []
    matched: dict[int, dict[str, Any]] = {}
    answered: set[int] = set()
    waiting: dict[str, list[dict]] = {}  # the calls of an id no result answered yet, in order
    latest: dict[str, dict] = {}
    for call, result in _CALLS_AND_RESULTS.get(api, _chat_calls_and_results)(items):
        if call is not None:
            calls.append(call)
            _, _, holder, call_id, _ = call
            if isinstance(call_id, str):
                queue = waiting.get(call_id)
                if queue is None:
                    waiting[call_id] = [holder]
                else:
                    queue.append(holder)
                latest[call_id] = holder
            continue
        at, n, result, result_id = result
        if not isinstance(result_id, str):
            continue
        results.append((at, n, result))
        queue = waiting.get(result_id)
        holder = queue.pop(0) if queue else latest.get(result_id)
        if holder is not None:
            matched[id(result)] = holder
            answered.add(id(holder))
    return _Links(calls, results, matched, answered)


# The calls a history makes and the results it carries, in order, by API: each entry is
# (a call, None) or (None, (the item, the block (Messages), the result, the id it answers)).
_Result = tuple[int, int, dict[str, Any], Any]


def _chat_calls_and_results(items: list[Any]) -> Iterator[tuple[_Call | None, _Result | None]]:
    for at, item in enumerate(items):
        if not isinstance(item, dict):
            continue
        role = item.get("role")
        if role == "tool":
            yield None, (at, 0, item, item.get("tool_call_id"))
        elif role == "assistant":
            entries = item.get("tool_calls")
            for n, call in enumerate(entries if isinstance(entries, list) else ()):
                if isinstance(call, dict):
                    function = call.get("function")
                    yield (at, n, call, call.get("id"), function.get("name") if isinstance(function, dict) else None), None


def _responses_calls_and_results(items: list[Any]) -> Iterator[tuple[_Call | None, _Result | None]]:
    for at, item in enumerate(items):
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind == "function_call_output":
            yield None, (at, 0, item, item.get("call_id"))
        elif kind == "function_call":
            yield (at, 0, item, item.get("call_id"), item.get("name")), None


def _messages_calls_and_results(items: list[Any]) -> Iterator[tuple[_Call | None, _Result | None]]:
    for at, item in enumerate(items):
        content = item.get("content") if isinstance(item, dict) else None
        if not isinstance(content, list):
            continue
        assistant = item.get("role") == "assistant"
        for n, block in enumerate(content):
            if not isinstance(block, dict):
                continue
            if assistant and block.get("type") == "tool_use":
                yield (at, n, block, block.get("id"), block.get("name")), None
            elif not assistant and block.get("type") == "tool_result":
                yield None, (at, n, block, block.get("tool_use_id"))


_CALLS_AND_RESULTS = {RESPONSES: _responses_calls_and_results, MESSAGES: _messages_calls_and_results}


def _model_runs(items: list[Any]) -> list[tuple[int, list[dict[str, Any]]]]:
    """(start, items) of each run of the model's own items in a Responses input."""
    runs: list[tuple[int, list[dict[str, Any]]]] = []
    current: list[dict[str, Any]] = []
    start = 0
    for at, item in enumerate(items):
        is_model = isinstance(item, dict) and (
            item.get("type") in ("reasoning", "function_call")
            or item.get("role") == "assistant" and item.get("type", "message") == "message"
        )
        if is_model:
            if not current:
                start = at
            current.append(item)
        elif current:
            runs.append((start, current))
            current = []
    if current:
        runs.append((start, current))
    return runs


def _is_text_part(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type", "text") in _TEXT_PARTS and isinstance(part.get("text"), str)
