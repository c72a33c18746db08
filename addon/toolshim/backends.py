"""What backends need and do, by model name and request: the request repairs (a table, and the
option that overrides it), and whether an answer starts inside reasoning the template opened.

Request repairs are made only where a backend is known to need them (research and the links in
the README's "Request repairs"): a request to a model the table does not know, with the option
at its default, reaches upstream byte for byte.

    reasoning                  give an assistant turn back the reasoning the client was sent with
                               it and dropped (Moonshot and DeepSeek answer 400 without it; GLM's
                               and MiniMax's docs ask for it)
    kimi_ids                   history tool-call ids in Kimi's own `functions.NAME:IDX` form (its
                               chat template renders ids verbatim; other ids degrade its calls)
    orphan_results             a synthetic result for an assistant tool call that has none
                               (Moonshot and DeepSeek reject such a history)
    tool_content               tool results as plain text: parts flattened, missing content filled
    developer_role             `developer` messages sent as `system` (Qwen and GLM templates
                               reject the role)
    strip_strict               `strict` removed from tool definitions (older vLLM: extra_forbidden)
    strip_parallel_tool_calls  `parallel_tool_calls` removed (some gateways answer 400)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

REASONING = "reasoning"
KIMI_IDS = "kimi_ids"
ORPHAN_RESULTS = "orphan_results"
TOOL_CONTENT = "tool_content"
DEVELOPER_ROLE = "developer_role"
STRIP_STRICT = "strip_strict"
STRIP_PARALLEL = "strip_parallel_tool_calls"
REPAIRS = (REASONING, KIMI_IDS, ORPHAN_RESULTS, TOOL_CONTENT, DEVELOPER_ROLE, STRIP_STRICT, STRIP_PARALLEL)

# Which assistant turns a backend wants its reasoning back on.
TOOL_CALL_TURNS = "tool_call_turns"  # Moonshot: "… missing in assistant tool call message"
ALL_TURNS = "all_turns"  # DeepSeek V3.2+ thinking mode: every assistant turn once tools were used


@dataclass(frozen=True, slots=True)
class Backend:
    family: str
    repairs: frozenset[str]
    reasoning_turns: str = TOOL_CALL_TURNS


_TABLE: tuple[tuple[re.Pattern[str], Backend], ...] = (
    # Moonshot: 400 on missing reasoning_content in tool-call turns and on a tool message without
    # content; template renders ids verbatim.
    (re.compile(r"kimi|moonshot", re.I), Backend("kimi", frozenset({REASONING, KIMI_IDS, ORPHAN_RESULTS, TOOL_CONTENT}))),
    # DeepSeek: "The reasoning_content in the thinking mode must be passed back to the API", on
    # assistant turns without calls too; rejects assistant tool calls without results.
    (re.compile(r"deepseek", re.I), Backend("deepseek", frozenset({REASONING, ORPHAN_RESULTS}), ALL_TURNS)),
    # GLM (Z.ai): thinking blocks "should be explicitly preserved and returned together with the
    # tool results"; its gateway rejects the developer role ("[1214] Incorrect role information").
    (re.compile(r"glm|chatglm|zai-org", re.I), Backend("glm", frozenset({REASONING, DEVELOPER_ROLE}))),
    # MiniMax M2+: interleaved thinking; its own ablation shows the loss when history thinking
    # is dropped (no 400), so every turn gets it back.
    (re.compile(r"minimax", re.I), Backend("minimax", frozenset({REASONING}), ALL_TURNS)),
    # Qwen chat templates raise "Unexpected message role" on developer; Qwen Code sends tool
    # results as parts, which vLLM's Qwen path rejects.
    (re.compile(r"qwen|qwq", re.I), Backend("qwen", frozenset({DEVELOPER_ROLE, TOOL_CONTENT}))),
    # gpt-oss on vLLM rejects tool results as an array of parts.
    (re.compile(r"gpt-oss", re.I), Backend("gpt-oss", frozenset({TOOL_CONTENT}))),
)

_UNKNOWN = Backend("", frozenset())


def backend_for(model: str) -> Backend:
    """The first table row whose pattern the model name matches (an unknown model needs nothing)."""
    for pattern, backend in _TABLE:
        if pattern.search(model):
            return backend
    return _UNKNOWN


@dataclass(frozen=True, slots=True)
class RepairPolicy:
    """The option `toolshim_request_repairs`, read: the table's choice (or none), plus and minus."""

    use_table: bool = True
    added: frozenset[str] = frozenset()
    removed: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, value: str) -> RepairPolicy:
        """Comma-separated terms: `auto` (the table's choice), `off` (no table: only what is named),
        a repair's name (made for every model), `-name` (never made). Raises ValueError naming
        what is wrong."""
        terms = [term.strip() for term in value.split(",") if term.strip()]
        use_table, added, removed = False, set(), set()
        for term in terms or ["auto"]:
            name = term[1:] if term.startswith("-") else term
            if term in ("auto", "off"):
                use_table = use_table or term == "auto"
            elif name in REPAIRS:
                (removed if term.startswith("-") else added).add(name)
            else:
                raise ValueError(
                    f"unknown term {term!r}: use 'auto', 'off', or repair names from {', '.join(REPAIRS)}, "
                    "each optionally prefixed with '-'"
                )
        return cls(use_table, frozenset(added), frozenset(removed))

    def repairs_for(self, backend: Backend) -> frozenset[str]:
        chosen = backend.repairs if self.use_table else frozenset()
        return (chosen | self.added) - self.removed


# -- thinking: does the answer start inside reasoning? ----------------------------------------------

# Chat templates that open the reasoning block in the prompt when thinking is on: the output
# starts inside it and only `</think>` (or a call, DeepSeek V4) ends it. DeepSeek V3.1 / V3.2 /
# V4 (`thinking`), GLM-4.5 and later (`enable_thinking`), MiniMax-M2 and later (always), Kimi
# K2-Thinking and K2.5 (`thinking`), Qwen3 thinking and Qwen3.5 (`enable_thinking`), NVIDIA
# Nemotron Nano 2 and Nemotron 3 (their templates end the prompt with `<think>\n` when thinking is
# on: llama.cpp's nemotron_v2 / nemotron_v3 chat formats read such output as opened). A template
# that leaves the tag to the model is read alike: an opening tag the model writes anyway is
# dropped (lexers/think.py).
THINKING_TEMPLATES = re.compile(r"deepseek|glm-?4\.[5-9]|glm-?[5-9]|minimax-m|kimi|moonshot|k2|qwen3|qwq|nemotron", re.I)
# Models whose name says they think whatever the request says: the templates that always open
# the block (DeepSeek-R1, QwQ, Qwen3 Thinking, Qwen3.5/3.6) and the suffixes `-reasoner` and
# `-thinking`. (A server that splits reasoning itself sends its reasoning field first, and then
# the content is not read as starting inside reasoning: chat.py.) MiniMax-M2 and GLM are read
# as pre-opened only when the request turns thinking on: recorded answers of theirs without the
# request saying so carry their reasoning elsewhere (flows/dialect_minimax_invoke).
_ALWAYS_THINKING = re.compile(r"deepseek-r1|qwq|qwen3[\w.-]*-thinking|qwen3\.[56]|[-_](?:reasoner|thinking)\b", re.I)
_THINKING_OFF = ("disabled", "none", "off", False)


def thinking_requested(request: dict) -> bool | None:
    """What the request says about thinking: True (on), False (off) or None (nothing).
    Read from `chat_template_kwargs` (`enable_thinking`, `thinking`), `thinking` (`{type:
    enabled | adaptive | disabled}` or a boolean), `reasoning_effort` and Responses' `reasoning`."""
    said: list[object] = []
    kwargs = request.get("chat_template_kwargs")
    if isinstance(kwargs, dict):
        said += [kwargs[name] for name in ("enable_thinking", "thinking") if isinstance(kwargs.get(name), bool)]
    thinking = request.get("thinking")
    if isinstance(thinking, dict) and isinstance(thinking.get("type"), str):
        said.append(thinking["type"].lower() not in _THINKING_OFF)
    elif isinstance(thinking, bool):
        said.append(thinking)
    effort = request.get("reasoning_effort")
    reasoning = request.get("reasoning")
    if isinstance(reasoning, dict) and isinstance(reasoning.get("effort"), str):
        effort = reasoning["effort"]
    if isinstance(effort, str):
        said.append(effort.lower() not in _THINKING_OFF)
    if False in said:  # an explicit "off" anywhere wins: the template then closes the block
        return False
    return True if said else None


def reasoning_preopened(model: str, request: dict) -> bool | None:
    """Does the answer start inside reasoning (None: the request and the name do not say; the
    lexers' own table by model name decides)?"""
    requested = thinking_requested(request)
    if requested is False:
        return False
    if requested and THINKING_TEMPLATES.search(model) or _ALWAYS_THINKING.search(model):
        return True
    return None
