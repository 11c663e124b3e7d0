"""Tools an agent can call: a Python callable plus the JSON Schema of its arguments.

:class:`Tool` pairs a function with its schema (written by hand, or derived from type
hints and a Google-style docstring by :meth:`Tool.from_function`); :class:`ToolSet`
names the tools of an environment; :func:`validate_arguments` checks a call's
arguments against the schema with ``jsonschema`` (Draft 2020-12).
"""

from __future__ import annotations

import copy
import inspect
import json
import re
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from swarmjax.text.toolcalls import CallError

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def _validator_class() -> type:
    # jsonschema is imported on first use so `import swarmjax` does not need it.
    try:
        from jsonschema import Draft202012Validator
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("swarmjax.text.tools needs the jsonschema package: pip install jsonschema") from e
    return Draft202012Validator


@dataclass(frozen=True)
class Tool:
    """A callable tool. ``parameters`` is a JSON Schema object
    (``{"type": "object", "properties": {..}, "required": [..]}``); ``fn`` takes the
    arguments as keyword arguments and returns a str, or any JSON-serialisable value
    (rendered with ``json.dumps(ensure_ascii=False)``).

    An argument name that is not a property is rejected unless the schema sets
    ``additionalProperties`` itself (``fn`` takes keyword arguments, so an unknown one
    would fail anyway)."""

    name: str
    description: str
    parameters: Mapping[str, Any]
    fn: Callable[..., Any] | None
    _validator: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise ValueError(f"tool {self.name!r}: the name must match [A-Za-z_][A-Za-z0-9_-]*")
        p = self.parameters
        if not isinstance(p, Mapping) or p.get("type") != "object":
            raise ValueError(f"tool {self.name!r}: parameters must be a JSON Schema object "
                             '({"type": "object", "properties": {...}, "required": [...]})')
        props, required = p.get("properties", {}), p.get("required", [])
        if not isinstance(props, Mapping):
            raise ValueError(f"tool {self.name!r}: parameters.properties must be an object")
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise ValueError(f"tool {self.name!r}: parameters.required must be a list of names")
        unknown = [r for r in required if r not in props]
        if unknown:
            raise ValueError(f"tool {self.name!r}: required names unknown properties {unknown}")
        if self.fn is not None and not callable(self.fn):
            raise ValueError(f"tool {self.name!r}: fn is not callable")
        cls = _validator_class()
        try:
            cls.check_schema(p)
        except Exception as e:  # jsonschema.SchemaError
            raise ValueError(f"tool {self.name!r}: invalid parameters schema: {getattr(e, 'message', e)}") from e
        object.__setattr__(self, "_validator", cls(p))

    def bind(self, fn: Callable[..., Any]) -> Tool:
        """The same tool answered by ``fn`` (the schema, already checked, and its validator
        shared: an environment that builds its tools once and binds them to each episode's
        state skips the schema check, ~1 ms a tool)."""
        if not callable(fn):
            raise ValueError(f"tool {self.name!r}: fn is not callable")
        bound = copy.copy(self)
        object.__setattr__(bound, "fn", fn)
        return bound

    def schema(self) -> dict[str, Any]:
        """The function schema chat templates consume (a fresh copy)."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": copy.deepcopy(dict(self.parameters))}}

    def validate(self, arguments: Any) -> tuple[CallError, str]:
        """:func:`validate_arguments` of this tool."""
        return validate_arguments(self, arguments)

    def invoke(self, arguments: Mapping[str, Any]) -> str:
        """Call ``fn(**arguments)`` and render the result as text (exceptions propagate)."""
        if self.fn is None:
            raise RuntimeError(f"tool {self.name!r} has no fn: its environment answers its calls")
        out = self.fn(**arguments)
        return out if isinstance(out, str) else json.dumps(out, ensure_ascii=False)

    @classmethod
    def from_function(cls, fn: Callable[..., Any], *, name: str | None = None,
                      description: str | None = None) -> Tool:
        """A tool whose schema comes from ``fn``'s type hints (str, int, float, bool,
        list[...], dict[str, ...], Literal[...] -> enum, X | None) and whose descriptions
        come from its Google-style docstring (the text before the sections, and the
        ``Args:`` entries). Parameters without a default are required. Raises TypeError
        for an unsupported hint or signature."""
        name = name or getattr(fn, "__name__", None)
        summary, arg_docs = _parse_docstring(inspect.getdoc(fn) or "")
        description = summary if description is None else description
        if not description:
            raise ValueError(f"tool {name!r}: no description; give the function a docstring or pass description=")
        return cls(name, description, _function_parameters(fn, arg_docs, str(name)), fn)


def validate_arguments(tool: Tool, arguments: Any) -> tuple[CallError, str]:
    """Check ``arguments`` against ``tool.parameters``: ``(CallError.NONE, "")``, or
    MISSING_ARGUMENT / BAD_ARGUMENT with a short message naming the argument."""
    if not isinstance(arguments, Mapping):
        return CallError.BAD_ARGUMENT, f"the arguments of {tool.name!r} must be a JSON object."
    props = tool.parameters.get("properties", {})
    unknown = [] if "additionalProperties" in tool.parameters else [k for k in arguments if k not in props]
    errors = list(tool._validator.iter_errors(arguments))
    missing = [e for e in errors if e.validator == "required"]
    if missing:
        e = min(missing, key=lambda e: len(e.absolute_path))
        if e.absolute_path:
            message = f"tool {tool.name!r}: argument {_path(e.absolute_path)}: {e.message}."
        else:
            absent = [r for r in tool.parameters.get("required", []) if r not in arguments]
            message = f"tool {tool.name!r} is missing required argument {', '.join(map(repr, absent))}."
        if unknown:
            message += f" Unknown argument {', '.join(map(repr, unknown))}."
        return CallError.MISSING_ARGUMENT, message
    if unknown:
        known = ", ".join(props) or "none"
        return CallError.BAD_ARGUMENT, (f"tool {tool.name!r} has no argument {', '.join(map(repr, unknown))}. "
                                        f"Its arguments: {known}.")
    if errors:
        e = min(errors, key=lambda e: len(e.absolute_path))
        where = f"argument {_path(e.absolute_path)}: " if e.absolute_path else ""
        return CallError.BAD_ARGUMENT, f"tool {tool.name!r}: {where}{e.message}."
    return CallError.NONE, ""


def _path(path: Iterable[Any]) -> str:
    first, *rest = list(path)
    return repr(str(first) + "".join(f"[{p!r}]" for p in rest))


class ToolSet(Mapping[str, Tool]):
    """The tools of an environment by name (in the order given); a duplicate name is
    an error."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        by_name: dict[str, Tool] = {}
        for t in tools:
            if not isinstance(t, Tool):
                raise TypeError(f"ToolSet takes Tool objects, got {type(t).__name__}")
            if t.name in by_name:
                raise ValueError(f"duplicate tool name {t.name!r}")
            by_name[t.name] = t
        self._tools = by_name

    def __getitem__(self, name: str) -> Tool:
        return self._tools[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tools)

    def __len__(self) -> int:
        return len(self._tools)

    def __repr__(self) -> str:
        return f"ToolSet({list(self._tools)})"

    def schemas(self) -> list[dict[str, Any]]:
        """The function schemas of every tool, for the chat template's ``tools=``."""
        return [t.schema() for t in self._tools.values()]


# --------------------------------------------------------------------------- from_function
# A small converter of our own rather than transformers.utils.get_json_schema:
# transformers is an optional (test-only) dependency and slow to import, and this
# covers the hints tools use with errors that name the parameter.

_SCALARS: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}
_SECTION = re.compile(r"(Args|Arguments|Parameters|Returns?|Yields?|Raises|Examples?|Notes?|Attributes)\s*:\s*$")
_ARG_ENTRY = re.compile(r"(\s*)\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def _literal_type(value: Any) -> str:
    if value is None:
        return "null"
    for py, js in _SCALARS.items():
        if type(value) is py:
            return js
    raise TypeError(f"Literal value {value!r} is not a str, int, float, bool or None")


def _hint_schema(hint: Any, where: str) -> dict[str, Any]:
    if hint in _SCALARS:
        return {"type": _SCALARS[hint]}
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is list or origin is list:
        return {"type": "array", **({"items": _hint_schema(args[0], where)} if args else {})}
    if hint is dict or origin is dict:
        if args and args[0] is not str:
            raise TypeError(f"{where}: JSON object keys are strings, got {hint!r}")
        return {"type": "object", **({"additionalProperties": _hint_schema(args[1], where)} if args else {})}
    if origin is Literal:
        kinds = sorted({_literal_type(v) for v in args})
        return {"type": kinds[0] if len(kinds) == 1 else kinds, "enum": list(args)}
    if origin in (typing.Union, types.UnionType) and type(None) in args and len(args) == 2:
        inner = _hint_schema(next(a for a in args if a is not type(None)), where)
        kinds = inner["type"] if isinstance(inner["type"], list) else [inner["type"]]
        inner["type"] = [*kinds, "null"]
        if "enum" in inner:
            inner["enum"] = [*inner["enum"], None]
        return inner
    raise TypeError(f"{where}: unsupported type hint {hint!r}; use str, int, float, bool, "
                    "list[...], dict[str, ...], Literal[...] or X | None")


def _function_parameters(fn: Callable[..., Any], docs: Mapping[str, str], tool: str) -> dict[str, Any]:
    hints = typing.get_type_hints(fn)
    properties: dict[str, Any] = {}
    required: list[str] = []
    extra = False
    for p in inspect.signature(fn).parameters.values():
        where = f"tool {tool!r}, parameter {p.name!r}"
        if p.kind is p.VAR_KEYWORD:
            extra = True
            continue
        if p.kind in (p.VAR_POSITIONAL, p.POSITIONAL_ONLY):
            raise TypeError(f"{where}: tools are called with keyword arguments only")
        if p.name not in hints:
            raise TypeError(f"{where}: no type hint")
        properties[p.name] = _hint_schema(hints[p.name], where)
        if p.name in docs:
            properties[p.name]["description"] = docs[p.name]
        if p.default is p.empty:
            required.append(p.name)
    schema: dict[str, Any] = {"type": "object", "properties": properties, "required": required}
    if extra:
        schema["additionalProperties"] = True
    return schema


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """(the description before the first section, {argument: description} of ``Args:``)."""
    summary: list[str] = []
    args: dict[str, str] = {}
    section: str | None = None
    current, indent = None, 0
    for line in doc.splitlines():
        header = _SECTION.match(line)
        if header:
            section, current = header.group(1).lower(), None
        elif section is None:
            summary.append(line)
        elif section in ("args", "arguments", "parameters") and line.strip():
            entry = _ARG_ENTRY.match(line)
            if entry and (current is None or len(entry.group(1)) <= indent):
                current, indent = entry.group(2), len(entry.group(1))
                args[current] = entry.group(3).strip()
            elif current is not None:
                args[current] = f"{args[current]} {line.strip()}".strip()
    return "\n".join(summary).strip(), args
