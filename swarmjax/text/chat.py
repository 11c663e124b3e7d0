"""Chat formats as id streams, built turn by turn (token-in-token-out).

A ``ChatFormat`` never renders a conversation with Jinja. It assembles ids from
constant pieces (added tokens and the fixed text between them, each an int32
array built once in ``__init__``) and ``tokenizer.encode`` of the text segments
that lie between added tokens. Added tokens split the text before the
pre-tokenizer runs, so the stream equals the tokenization of the full render:

    prompt_ids + turn_1 + after_turn_ids(turn_1) + tool_responses_ids(...) + turn_2 + ...
      == AutoTokenizer.apply_chat_template(conversation_so_far, tools=..., enable_thinking=...,
                                           add_generation_prompt=..., tokenize=True)

at every turn boundary, with the templates shipped here (``templates/*.jinja``)
and a turn sampled as ``tokenizer.encode(assistant_text(...)) + stop id``
(``assistant_ids``). A policy may sample another tokenization of the same text,
or end a Qwen3 turn with ``<|endoftext|>`` (a Llama 3 tool-call turn with
``<|eot_id|>``); the stream keeps what was sampled, and a re-render would differ
there: train on the stream, never on a re-render.

Qwen3 differs from its published template on purpose: the published one keeps
a ``<think>`` block only for the assistant turns after the last user query and
drops an EMPTY block from every non-last turn, so a stream generated behind
``<think>\\n\\n</think>\\n\\n`` (thinking off) or extended by a follow-up query is no
prefix of the later full render. Ours renders every assistant turn with the
think block it was generated with: ``reasoning_content`` (possibly empty), the
block inside its content, or, with ``enable_thinking=false``, the empty block.

Llama 3 follows Meta's Llama 3.1 Instruct template (custom tools in the first
user message, results as JSON strings in ``ipython`` turns; ``tests/data`` holds
its renders): a conversation with one call per turn is id-exact. Two extensions
it has no room for: several calls in one turn, joined by ``"; "``, and content
after the calls (3.1 drops it). Assistant text is kept as sampled, where 3.1
trims it on re-render.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, ClassVar

import numpy as np

from swarmjax.text.tokenizer import TextTokenizer

Piece = str | np.ndarray  # a text segment to encode, or constant int32 ids
Message = Mapping[str, Any]


@dataclass(frozen=True)
class TokenSpec:
    """An added token a format needs; ``special`` ones are dropped by skip_special_tokens."""

    content: str
    special: bool = True


def load_template(name: str) -> str:
    """The Jinja chat template shipped as package data, ``templates/{name}.jinja``."""
    return (resources.files("swarmjax.text") / "templates" / f"{name}.jinja").read_text(encoding="utf-8")


def _const(ids: np.ndarray) -> np.ndarray:
    ids = np.asarray(ids, dtype=np.int32).reshape(-1)
    ids.flags.writeable = False  # shared by every stream built with this format
    return ids


def call_parts(call: Mapping[str, Any]) -> tuple[str, Any]:
    """(name, arguments) of an OpenAI-style ``{"function": {...}}`` call or a flat one."""
    fn = call.get("function", call)
    return fn["name"], fn.get("arguments", {})


def message_text(message: Message) -> str:
    """A message's text: its ``content`` string, or the joined ``text`` parts of an
    OpenAI-style content list (None: "")."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = [p.get("text", "") for p in content if isinstance(p, Mapping) and p.get("type", "text") == "text"]
    if len(parts) != len(content):
        raise ValueError(f"a {message.get('role')!r} message's content holds parts other than text")
    return "".join(parts)


def _runs(messages: Sequence[Message]) -> list[tuple[str, list[str]]]:
    """Consecutive messages of one role, with their texts: [(role, [text, ...]), ...]."""
    runs: list[tuple[str, list[str]]] = []
    for m in messages:
        if runs and runs[-1][0] == m["role"]:
            runs[-1][1].append(message_text(m))
        else:
            runs.append((m["role"], [message_text(m)]))
    return runs


def _arguments_text(arguments: Any) -> str:
    # A string is the model's own JSON, kept verbatim; anything else is written as the
    # transformers ``tojson`` filter does (json.dumps, ensure_ascii=False).
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


class ChatFormat:
    """A chat family's id layout. Subclasses set the tokens and the turn pieces.

    Args:
      tokenizer: a ``TextTokenizer`` holding the family's added tokens.
      thinking: the ``enable_thinking`` the stream is generated with (Qwen3 only).
    """

    name: ClassVar[str]
    call_syntax: ClassVar[str]  # the key of toolcalls.CALL_SYNTAXES that parses its turns
    tokens: ClassVar[tuple[TokenSpec, ...]]
    stop_tokens: ClassVar[tuple[str, ...]]
    eos_token: ClassVar[str]
    pad_token: ClassVar[str]
    bos_token: ClassVar[str | None] = None

    def __init__(self, tokenizer: TextTokenizer, *, thinking: bool = False):
        self.tokenizer = tokenizer
        self.thinking = thinking
        self.ids = {t.content: _const([tokenizer.token_id(t.content)]) for t in self.tokens}
        self.stop_ids = _const([tokenizer.token_id(t) for t in self.stop_tokens])
        self._generation_prompt = _const(self.assemble(self._generation_prompt_pieces()))

    @classmethod
    def template(cls) -> str:
        """The Jinja chat template of this family (package data)."""
        return load_template(cls.name)

    @classmethod
    def fixed_texts(cls) -> list[str]:
        """The family's fixed texts (its UPPER-CASE string constants: tool instructions,
        headers, a default system message), inherited ones included, in definition order:
        what a tokenizer trained for the family should see."""
        texts: dict[str, str] = {}
        for klass in reversed(cls.__mro__):
            texts.update({k: v for k, v in vars(klass).items() if k.isupper() and isinstance(v, str)})
        return list(texts.values())

    @property
    def template_kwargs(self) -> dict[str, Any]:
        """Extra ``apply_chat_template`` kwargs that reproduce this stream."""
        return {"enable_thinking": self.thinking}

    def assemble(self, pieces: Sequence[Piece]) -> np.ndarray:
        """Ids of a piece list: adjacent strings are joined and encoded once. -> int32 [T]."""
        out: list[np.ndarray] = []
        text: list[str] = []
        for piece in [*pieces, None]:
            if isinstance(piece, str):
                text.append(piece)
                continue
            if text and "".join(text):
                out.append(self.tokenizer.encode("".join(text)))
            text = []
            if piece is not None:
                out.append(piece)
        return np.concatenate(out).astype(np.int32) if out else np.zeros([0], np.int32)

    # ---- streams ----------------------------------------------------------------------------

    def prompt_ids(self, messages: Sequence[Message], *, tools: Sequence[Mapping] | None = None) -> np.ndarray:
        """The first prompt: an optional leading system message, then user messages, then the
        generation prompt; ``tools`` (JSON schemas) go where the family puts them (Qwen: the
        system turn; Llama 3: the first user message). -> int32 [T]."""
        messages = list(messages)
        system = message_text(messages.pop(0)) if messages and messages[0]["role"] == "system" else None
        for m in messages:
            if m["role"] != "user":
                raise ValueError(f"prompt_ids takes a leading system message then user messages, got {m['role']!r}")
        opening = self._opening_pieces(system, [message_text(m) for m in messages], list(tools or []))
        return self.assemble([*self._begin_pieces(), *opening, self._generation_prompt])

    def generation_prompt_ids(self) -> np.ndarray:
        """The assistant header the model continues from. -> int32 [T] (read-only)."""
        return self._generation_prompt

    def after_turn_ids(self, turn_ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """Environment ids closing a sampled assistant turn [T] (loss mask 0). A turn that did
        not end with a stop id (cut by a length limit) is closed with the end-of-turn token too."""
        turn = np.asarray(turn_ids).reshape(-1)
        ended = turn.size > 0 and int(turn[-1]) in set(self.stop_ids.tolist())
        return self.assemble(self._after_turn_pieces(ended))

    def user_ids(self, text: str) -> np.ndarray:
        """A user turn then the generation prompt. -> int32 [T]."""
        return self.assemble([*self._turn_pieces("user", text), self._generation_prompt])

    def tool_responses_ids(self, contents: Sequence[str]) -> np.ndarray:
        """The results of one turn's tool calls (in call order), then the generation prompt.
        -> int32 [T]."""
        if not contents:
            raise ValueError("tool_responses_ids needs at least one response")
        return self.assemble([*self._tool_pieces(list(contents)), self._generation_prompt])

    def continuation_ids(self, messages: Sequence[Message]) -> np.ndarray:
        """What the environment appends after a closed assistant turn: ``tool`` messages (a
        run of them is one turn's results, in call order) and ``user`` messages, then the
        generation prompt. ``continuation_ids([tool x n]) == tool_responses_ids(...)``,
        ``continuation_ids([user]) == user_ids(...)``. -> int32 [T]."""
        pieces: list[Piece] = []
        for role, texts in _runs(messages):
            if role == "tool":
                pieces += self._tool_pieces(texts)
            elif role == "user":
                pieces += [p for t in texts for p in self._turn_pieces("user", t)]
            else:
                raise ValueError(f"a continuation holds tool and user messages, got {role!r}")
        if not pieces:
            raise ValueError("a continuation needs at least one tool or user message")
        return self.assemble([*pieces, self._generation_prompt])

    def conversation_ids(self, messages: Sequence[Message], *, tools: Sequence[Mapping] | None = None) -> np.ndarray:
        """A whole conversation up to the next generation prompt, re-rendered: the opening
        (:meth:`prompt_ids`), then per assistant message its canonical ids
        (:meth:`assistant_ids` from its content, ``tool_calls`` and, thinking on,
        ``reasoning_content``) closed by :meth:`after_turn_ids`, and the messages after it
        (:meth:`continuation_ids`). For the shipped templates this equals
        ``apply_chat_template(messages, tools=tools, add_generation_prompt=True)``; a
        stream a model sampled differs from it wherever the model chose another
        tokenization of the same text, so train on the stream, never on this. The last
        message is a user or tool one. -> int32 [T]."""
        messages = list(messages)
        first = next((i for i, m in enumerate(messages) if m["role"] not in ("system", "user")), len(messages))
        out = [self.prompt_ids(messages[:first], tools=tools)]
        rest = messages[first:]
        while rest:
            turn = rest.pop(0)
            if turn["role"] != "assistant":
                raise ValueError(f"messages after the opening alternate assistant turns and tool/user runs, "
                                 f"got {turn['role']!r} where an assistant turn goes")
            reasoning = turn.get("reasoning_content") if self.thinking else None
            ids = self.assistant_ids(message_text(turn), turn.get("tool_calls") or (), reasoning=reasoning)
            run = []
            while rest and rest[0]["role"] != "assistant":
                run.append(rest.pop(0))
            if not run:
                raise ValueError("a conversation to render ends with a user or tool message (or two assistant "
                                 "messages follow each other)")
            out += [ids, self.after_turn_ids(ids), self.continuation_ids(run)]
        return np.concatenate(out).astype(np.int32)

    # ---- text a model emits -------------------------------------------------------------------

    def tool_call_text(self, name: str, arguments: Any) -> str:
        """One tool call as the model writes it; ``arguments`` a JSON string (verbatim) or a value."""
        raise NotImplementedError

    def tool_response_frame(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, str, str]:
        """The pieces of :meth:`tool_responses_ids` for an environment that joins them
        itself (:mod:`swarmjax.text.fragments`): ``(open, between, close, before,
        after)`` with ``tool_responses_ids([c1, .., cn]) == open + encode(before + c1 +
        after) + between + .. + encode(before + cn + after) + close`` (ids int32)."""
        raise NotImplementedError(f"{self.name}: no tool-response frame for joined replies")

    def assistant_text(self, content: str, tool_calls: Sequence[Mapping[str, Any]] = (), *,
                       reasoning: str | None = None) -> str:
        """The exact text a model emits for a turn: what the render puts between the
        generation prompt and the end-of-turn token (think block, content, tool calls)."""
        calls = [self.tool_call_text(*call_parts(c)) for c in tool_calls]
        return self._think_text(reasoning) + self._body_text(content, calls)

    def assistant_ids(self, content: str, tool_calls: Sequence[Mapping[str, Any]] = (), *,
                      reasoning: str | None = None) -> np.ndarray:
        """A turn as a model that follows the format samples it (demonstrations, scripted
        tests): ``encode(assistant_text(...))`` + its end-of-turn id. -> int32 [T]."""
        text = self.assistant_text(content, tool_calls, reasoning=reasoning)
        return self.assemble([text, self.ids[self.stop_tokens[0]]])

    # ---- family hooks -------------------------------------------------------------------------

    def _begin_pieces(self) -> list[Piece]:
        return []

    def _body_text(self, content: str, calls: list[str]) -> str:
        raise NotImplementedError

    def _think_text(self, reasoning: str | None) -> str:
        if reasoning is not None:
            raise ValueError(f"{self.name} has no reasoning block")
        return ""

    def _generation_prompt_pieces(self) -> list[Piece]:
        raise NotImplementedError

    def _turn_pieces(self, role: str, text: str) -> list[Piece]:
        raise NotImplementedError

    def _opening_pieces(self, system: str | None, users: list[str], tools: list[Mapping]) -> list[Piece]:
        """The turns before the first generation prompt: the system turn (with the tools) when
        there is a system message or tools, then the user turns."""
        pieces = self._system_pieces(system, tools) if system is not None or tools else []
        return pieces + [p for u in users for p in self._turn_pieces("user", u)]

    def _system_pieces(self, system: str | None, tools: list[Mapping]) -> list[Piece]:
        raise NotImplementedError

    def _tool_pieces(self, contents: list[str]) -> list[Piece]:
        raise NotImplementedError

    def _after_turn_pieces(self, ended: bool) -> list[Piece]:
        raise NotImplementedError


class ChatMLFormat(ChatFormat):
    """What the Qwen families share: ChatML turns (``<|im_start|>role\n...<|im_end|>\n``),
    Hermes-style ``<tool_call>`` JSON, the tool schemas in the system turn (a
    ``DEFAULT_SYSTEM`` message when the family has one and none is given), the results of a
    turn's calls grouped in one user turn of ``<tool_response>`` blocks."""

    call_syntax = "hermes"
    stop_tokens = ("<|im_end|>", "<|endoftext|>")
    eos_token = "<|im_end|>"
    pad_token = "<|endoftext|>"
    DEFAULT_SYSTEM: ClassVar[str | None] = None

    TOOLS_HEAD = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                  "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
    TOOLS_TAIL = ("\n</tools>\n\nFor each function call, return a json object with function name and "
                  "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
                  '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')

    def __init__(self, tokenizer: TextTokenizer, *, thinking: bool = False):
        super().__init__(tokenizer, thinking=thinking)
        self._im_start, self._im_end = self.ids["<|im_start|>"], self.ids["<|im_end|>"]
        self._end_nl = _const(self.assemble([self._im_end, "\n"]))  # "\n" always precedes <|im_start|>

    def tool_call_text(self, name: str, arguments: Any) -> str:
        return f'<tool_call>\n{{"name": "{name}", "arguments": {_arguments_text(arguments)}}}\n</tool_call>'

    def _body_text(self, content: str, calls: list[str]) -> str:
        return content + ("\n" if calls and self._shown(content) else "") + "\n".join(calls)

    def _shown(self, content: str) -> str:
        """The part of a turn's content the template writes before its calls."""
        return content

    def _generation_prompt_pieces(self) -> list[Piece]:
        return [self.ids["<|im_start|>"], "assistant\n"]

    def _turn_pieces(self, role: str, text: str) -> list[Piece]:
        return [self._im_start, f"{role}\n{text}", self._end_nl]

    def _opening_pieces(self, system: str | None, users: list[str], tools: list[Mapping]) -> list[Piece]:
        return super()._opening_pieces(self.DEFAULT_SYSTEM if system is None else system, users, tools)

    def _system_pieces(self, system: str | None, tools: list[Mapping]) -> list[Piece]:
        if not tools:
            return self._turn_pieces("system", system or "")
        head = "system\n" + ("" if system is None else system + "\n\n") + self.TOOLS_HEAD
        schemas = "".join("\n" + json.dumps(t, ensure_ascii=False) for t in tools)  # = "\n" + tool|tojson
        return [self._im_start, head + schemas + self.TOOLS_TAIL, self._end_nl]

    def _tool_pieces(self, contents: list[str]) -> list[Piece]:
        # the tags are added tokens in Qwen3's vocabulary (encode splits them out) and text in Qwen2.5's
        text = "".join(f"\n<tool_response>\n{c}\n</tool_response>" for c in contents)
        return [self._im_start, "user" + text, self._end_nl]

    def _after_turn_pieces(self, ended: bool) -> list[Piece]:
        return ["\n"] if ended else [self._end_nl]


class Qwen3Format(ChatMLFormat):
    """Qwen3: ChatML with ``<think>`` blocks (see the module docstring for the prefix-stable
    rule); ``<tool_response>`` and the think tags are added tokens of its vocabulary."""

    name = "qwen3"
    tokens = (TokenSpec("<|endoftext|>"), TokenSpec("<|im_start|>"), TokenSpec("<|im_end|>"),
              TokenSpec("<tool_call>", False), TokenSpec("</tool_call>", False),
              TokenSpec("<tool_response>", False), TokenSpec("</tool_response>", False),
              TokenSpec("<think>", False), TokenSpec("</think>", False))

    def _shown(self, content: str) -> str:
        return content.split("</think>")[-1].lstrip("\n")  # the text after a think block, as the template

    def _think_text(self, reasoning: str | None) -> str:
        if reasoning is None:
            return ""
        if not self.thinking:
            raise ValueError("thinking is off: the generation prompt already holds the empty think block")
        return f"<think>\n{reasoning}\n</think>\n\n"

    def _generation_prompt_pieces(self) -> list[Piece]:
        empty_think = [] if self.thinking else [self.ids["<think>"], "\n\n", self.ids["</think>"], "\n\n"]
        return [*super()._generation_prompt_pieces(), *empty_think]

    def tool_response_frame(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, str, str]:
        response_open, response_close = self.ids["<tool_response>"], self.ids["</tool_response>"]
        open_ = self.assemble([self._im_start, "user\n", response_open])
        between = self.assemble([response_close, "\n", response_open])
        close = self.assemble([response_close, self._end_nl, self._generation_prompt])
        return open_, between, close, "\n", "\n"


class Qwen25Format(ChatMLFormat):
    """Qwen2.5: ChatML with a default system message when none is given and no reasoning
    block (``thinking=True`` is refused). ``<tool_response>`` is text in its vocabulary, not
    an added token, so it has no device tool-response frame."""

    name = "qwen2.5"
    tokens = (TokenSpec("<|endoftext|>"), TokenSpec("<|im_start|>"), TokenSpec("<|im_end|>"),
              TokenSpec("<tool_call>", False), TokenSpec("</tool_call>", False))
    DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

    def __init__(self, tokenizer: TextTokenizer, *, thinking: bool = False):
        if thinking:
            raise ValueError("qwen2.5 has no thinking mode")
        super().__init__(tokenizer, thinking=False)

    @property
    def template_kwargs(self) -> dict[str, Any]:
        return {}


class Qwen2Format(Qwen25Format):
    """Qwen2: ChatML with the default system message ``You are a helpful assistant.``; its
    vocabulary has three added tokens (``<tool_call>`` is text). Its published template
    renders no tools: with tools the stream, and the template swarmjax ships for it, lay
    them out as Qwen2.5 does (an extension)."""

    name = "qwen2"
    tokens = (TokenSpec("<|endoftext|>"), TokenSpec("<|im_start|>"), TokenSpec("<|im_end|>"))
    DEFAULT_SYSTEM = "You are a helpful assistant."

    @classmethod
    def template(cls) -> str:
        """Qwen2.5's template with Qwen2's default system message."""
        body = load_template(Qwen25Format.name).split("-#}\n", 1)[1]
        return ("{#- swarmjax Qwen2 chat format: the Qwen2.5 layout (templates/qwen2.5.jinja) with Qwen2's "
                "default system message. -#}\n" + body.replace(Qwen25Format.DEFAULT_SYSTEM, cls.DEFAULT_SYSTEM)
                .replace("swarmjax qwen2.5:", "swarmjax qwen2:"))


class Llama3Format(ChatFormat):
    """Llama 3.1: header turns; a system turn that always opens with the knowledge-cutoff and
    date lines (``Environment: ipython`` first when there are tools); the tool schemas
    (``tojson(indent=4)``) and their instructions in the FIRST user message; a tool call as
    ``{"name": N, "parameters": ARGS}`` ending with ``<|eot_id|>``; each result as an
    ``ipython`` turn holding the result as a JSON string. System and user text is trimmed, as
    the 3.1 template does. Extensions the 3.1 template refuses or drops: several calls in one
    turn, joined by ``"; "``, and content after the calls, on a new line. No reasoning block
    (``thinking=True`` is refused)."""

    name = "llama3"
    call_syntax = "llama3_json"
    tokens = (TokenSpec("<|begin_of_text|>"), TokenSpec("<|end_of_text|>"), TokenSpec("<|start_header_id|>"),
              TokenSpec("<|end_header_id|>"), TokenSpec("<|eot_id|>"), TokenSpec("<|eom_id|>"),
              TokenSpec("<|python_tag|>"))
    stop_tokens = ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>")
    eos_token = "<|eot_id|>"
    pad_token = "<|end_of_text|>"
    bos_token = "<|begin_of_text|>"

    DATE = "26 Jul 2024"  # the 3.1 template's date_string when none is given
    SYSTEM_HEAD = "Cutting Knowledge Date: December 2023\nToday Date: {date}\n\n"
    # The text the 3.1 template puts before the tool schemas in the first user message.
    TOOLS_HEAD = ("Given the following functions, please respond with a JSON for a function call with its "
                  "proper arguments that best answers the given prompt.\n\nRespond in the format "
                  '{"name": function name, "parameters": dictionary of argument name and its value}.'
                  "Do not use variables.\n\n")

    def __init__(self, tokenizer: TextTokenizer, *, thinking: bool = False):
        if thinking:
            raise ValueError("llama3 has no thinking mode")
        super().__init__(tokenizer, thinking=False)
        self._eot = self.ids["<|eot_id|>"]

    @property
    def template_kwargs(self) -> dict[str, Any]:
        return {"date_string": self.DATE}

    def tool_call_text(self, name: str, arguments: Any) -> str:
        return f'{{"name": "{name}", "parameters": {_arguments_text(arguments)}}}'

    def _body_text(self, content: str, calls: list[str]) -> str:
        # Calls first, "; "-separated (vLLM's llama3_json convention, toolcalls.py parses it);
        # any content follows them on a new line.
        return "; ".join(calls) + ("\n" if calls and content else "") + content

    def _header(self, role: str) -> list[Piece]:
        return [self.ids["<|start_header_id|>"], role, self.ids["<|end_header_id|>"], "\n\n"]

    def _begin_pieces(self) -> list[Piece]:
        return [self.ids["<|begin_of_text|>"]]

    def _generation_prompt_pieces(self) -> list[Piece]:
        return self._header("assistant")

    def _turn_pieces(self, role: str, text: str) -> list[Piece]:
        return [*self._header(role), text.strip() if role in ("system", "user") else text, self._eot]

    def _opening_pieces(self, system: str | None, users: list[str], tools: list[Mapping]) -> list[Piece]:
        head = ("Environment: ipython\n" if tools else "") + self.SYSTEM_HEAD.format(date=self.DATE)
        pieces = [*self._header("system"), head + (system or "").strip(), self._eot]
        if tools:
            if not users:
                raise ValueError("llama3 puts the tool schemas in the first user message: give one")
            schemas = "".join(json.dumps(t, ensure_ascii=False, indent=4) + "\n\n" for t in tools)  # tojson(indent=4)
            pieces += self._turn_pieces("user", self.TOOLS_HEAD + schemas + users[0].strip())
            users = users[1:]
        return pieces + [p for u in users for p in self._turn_pieces("user", u)]

    def _tool_pieces(self, contents: list[str]) -> list[Piece]:
        # The 3.1 template writes a string result with ``tojson`` (a string is iterable in Jinja).
        return [p for c in contents for p in self._turn_pieces("ipython", json.dumps(c, ensure_ascii=False))]

    def _after_turn_pieces(self, ended: bool) -> list[Piece]:
        return [] if ended else [self._eot]


CHAT_FORMATS: dict[str, type[ChatFormat]] = {"qwen3": Qwen3Format, "qwen2.5": Qwen25Format, "qwen2": Qwen2Format,
                                              "llama3": Llama3Format}


def chat_format(name: str, tokenizer: TextTokenizer, *, thinking: bool = False) -> ChatFormat:
    """The ``ChatFormat`` called ``name`` (a key of ``CHAT_FORMATS``) over ``tokenizer``."""
    if name not in CHAT_FORMATS:
        raise ValueError(f"unknown chat format {name!r}; known: {sorted(CHAT_FORMATS)}")
    return CHAT_FORMATS[name](tokenizer, thinking=thinking)


# (format, marks its template holds): the first whose marks are all in a tokenizer's template
_TEMPLATE_MARKS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("qwen3", ("<|im_start|>", "<tool_call>", "<think>")),
    ("qwen2.5", ("<|im_start|>", Qwen25Format.DEFAULT_SYSTEM)),
    ("llama3", ("<|start_header_id|>", "<|eot_id|>")),
    ("qwen2", ("<|im_start|>",)),        # any other ChatML template (Qwen2's has no tools)
)


def detect_chat_format(tokenizer: TextTokenizer) -> str:
    """The key of :data:`CHAT_FORMATS` a tokenizer's chat template is written in: Qwen3
    (ChatML with ``<tool_call>`` and ``<think>``), Qwen2.5 (ChatML with its default system
    message), Llama 3.x (header ids) or Qwen2 (any other ChatML). Raises
    ValueError when the tokenizer has no template or one of another family (pass the
    format by name then)."""
    template = tokenizer.chat_template
    if template is None:
        raise ValueError(f"the tokenizer in {tokenizer.path} has no chat template: name the chat format "
                         f"(chat=..., one of {sorted(CHAT_FORMATS)})")
    for name, marks in _TEMPLATE_MARKS:
        if all(m in template for m in marks):
            return name
    raise ValueError(f"the chat template of {tokenizer.path} is none of {sorted(CHAT_FORMATS)} (Qwen3: "
                     f"<|im_start|> with <tool_call> and <think>; Qwen2.5: its default system message; "
                     "Qwen2: other <|im_start|> templates; Llama 3.x: <|start_header_id|>); name "
                     "the format (chat=...) if its turns are laid out as one of them")
