"""Tools, the host tool-call parser and the tool runner (pure Python, fast)."""

import json
import random
import threading
from typing import Literal

import pytest

from swarmjax.text.runner import ToolResult, ToolRunner
from swarmjax.text.toolcalls import CALL_SYNTAXES, CallError, ToolCall, error_reply, parse_turn
from swarmjax.text.tools import Tool, ToolSet, validate_arguments

E = CallError


def get_weather(city: str, unit: Literal["c", "f"] = "c", days: int = 1) -> str:
    """Get the weather forecast of a city.

    Args:
        city: The city name,
            e.g. Paris.
        unit (str): The temperature unit.
        days: How many days.

    Returns:
        The forecast.
    """
    return f"{city}: 21{unit} for {days}d"


def now() -> dict:
    """The current time."""
    return {"time": "12:00", "zone": "東京"}


WEATHER = Tool.from_function(get_weather)
TOOLS = ToolSet([WEATHER, Tool.from_function(now)])


def call(obj, *, raw=None) -> str:
    return f"<tool_call>\n{raw if raw is not None else json.dumps(obj)}\n</tool_call>"


def parse(text, syntax="hermes"):
    return parse_turn(text, TOOLS, syntax=syntax)


# --------------------------------------------------------------------------- hermes

def test_no_calls():
    t = parse("  Hello there.<|im_end|>")
    assert (t.content, t.reasoning, t.calls, t.has_errors) == ("Hello there.", None, (), False)


def test_one_call_with_content_around_and_stop():
    body = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    t = parse(f"Let me check.\n<tool_call>\n{body}\n</tool_call>\nOne moment.<|im_end|><|endoftext|>")
    assert t.content == "Let me check.\nOne moment."
    assert t.calls == (ToolCall("get_weather", {"city": "Paris"}, E.NONE, "", f"\n{body}\n"),)
    assert t.ok_calls == t.calls and not t.has_errors


def test_three_calls_whitespace_and_key_order():
    text = ('<tool_call>{"name":"now"}</tool_call>'
            '<tool_call>  {"arguments": {"days": 3, "city": "Oslo"}, "name": "get_weather"}\t</tool_call>\n\n  \n'
            '<tool_call>\n{\n  "name" : "get_weather",\n  "arguments" : {\n    "city": "Rome",\n    "unit": "f"\n  }\n}\n'
            '</tool_call>')
    t = parse(text)
    assert [(c.name, c.arguments, c.error) for c in t.calls] == [
        ("now", {}, E.NONE), ("get_weather", {"days": 3, "city": "Oslo"}, E.NONE),
        ("get_weather", {"city": "Rome", "unit": "f"}, E.NONE)]
    assert t.content == ""


@pytest.mark.parametrize("raw, city", [
    ('{"name": "get_weather", "arguments": {"city": "東京"}}', "東京"),
    ('{"name": "get_weather", "arguments": {"city": "Zürich 🌧️ \\"wet\\""}}', 'Zürich 🌧️ "wet"'),
    ('{"name": "get_weather", "arguments": {"city": "\\u6771\\u4eac \\ud83d\\ude00 \\n"}}', "東京 😀 \n"),
])
def test_unicode_and_escapes(raw, city):
    (c,) = parse(call(None, raw=raw)).calls
    assert c.ok and c.arguments == {"city": city}


def test_calls_inside_think_are_reasoning():
    t = parse(f"<think>\nMaybe {call({'name': 'now'})}?\n</think>\n\nIt is noon.")
    assert t.calls == () and t.content == "It is noon."
    assert t.reasoning == "Maybe " + call({"name": "now"}) + "?"


def test_unterminated_think_is_all_reasoning():
    t = parse(f"Hi <think>step 1 {call({'name': 'now'})} step 2")
    assert t.calls == () and t.content == "Hi" and t.reasoning.startswith("step 1") and t.reasoning.endswith("step 2")


def test_think_opened_by_the_prompt():
    t = parse(f"pondering\n</think>\n\nOK {call({'name': 'now'})}<|im_end|>")
    assert (t.reasoning, t.content, [c.name for c in t.ok_calls]) == ("pondering", "OK", ["now"])
    assert parse("<think>\n\n</think>\n\nHi").reasoning == ""


def test_bad_json():
    t = parse("x " + call(None, raw='{"name": "now", "arguments": {') + " y")
    (c,) = t.calls
    assert (c.error, c.name, c.arguments) == (E.BAD_JSON, None, None) and "invalid JSON" in c.message
    assert t.content == "x\ny" and t.has_errors and t.ok_calls == ()
    for raw in ('["now"]', '{"arguments": {}}', '{"name": 3}', '{"name": "now", "arguments": [1]}',
                '{"name": "now", "arguments": "nope"}', '{"name": "get_weather", "arguments": {"city": NaN}}', ""):
        assert parse(call(None, raw=raw)).calls[0].error == E.BAD_JSON, raw


def test_unknown_tool_reply_names_the_tools():
    (c,) = parse(call({"name": "foo", "arguments": {"a": 1}})).calls
    assert (c.error, c.name, c.arguments) == (E.UNKNOWN_TOOL, "foo", {"a": 1})
    assert error_reply(c) == "Error: unknown tool 'foo'. Available tools: get_weather, now."


def test_argument_errors():
    def err(args):
        (c,) = parse(call({"name": "get_weather", "arguments": args})).calls
        return c.error, c.message

    assert err({"unit": "c"}) == (E.MISSING_ARGUMENT, "tool 'get_weather' is missing required argument 'city'.")
    assert err({"city": 3})[0] == E.BAD_ARGUMENT and "'city'" in err({"city": 3})[1]
    assert err({"city": "a", "days": True})[0] == E.BAD_ARGUMENT
    assert err({"city": "a", "days": 1.5})[0] == E.BAD_ARGUMENT
    code, msg = err({"city": "a", "unit": "kelvin"})
    assert code == E.BAD_ARGUMENT and "'kelvin' is not one of ['c', 'f']" in msg
    code, msg = err({"city": "a", "colour": "red"})
    assert code == E.BAD_ARGUMENT and "'colour'" in msg and "city, unit, days" in msg
    assert err({"city": "a", "unit": "f", "days": 2}) == (E.NONE, "")


def test_missing_or_string_arguments():
    assert parse(call({"name": "now"})).calls[0].ok
    assert parse(call({"name": "get_weather"})).calls[0].error == E.MISSING_ARGUMENT
    (c,) = parse(call({"name": "get_weather", "arguments": json.dumps({"city": "Lyon"})})).calls
    assert c.ok and c.arguments == {"city": "Lyon"}


def test_unterminated_call_is_incomplete():
    t = parse(call({"name": "now"}) + '\n<tool_call>\n{"name": "get_weather", "arguments": {"ci<|im_end|>')
    assert [c.error for c in t.calls] == [E.NONE, E.INCOMPLETE]
    last = t.calls[1]
    assert last.name == "get_weather" and last.arguments is None and last.text.endswith('{"ci')
    assert error_reply(last).startswith("Error: the call to 'get_weather' was cut off")


def test_stray_closer_is_content():
    t = parse("a </tool_call> b")
    assert (t.content, t.calls) == ("a </tool_call> b", ())


def test_malformed_turns_never_raise_nor_leak_calls_into_content():
    parts = ["<tool_call>", "</tool_call>", "<think>", "</think>", '{"name": "now"}', '{"name": ',
             '"get_weather"', "}", "{", "text ", "\n", "<|im_end|>", '"', "\\"]
    rng = random.Random(0)
    for _ in range(500):
        t = parse("".join(rng.choice(parts) for _ in range(rng.randint(0, 12))))
        assert "<tool_call>" not in t.content


def test_error_reply_needs_a_failed_call():
    with pytest.raises(ValueError):
        error_reply(parse(call({"name": "now"})).calls[0])
    with pytest.raises(ValueError, match="hermes"):
        parse_turn("", TOOLS, syntax="nope")
    assert set(CALL_SYNTAXES) == {"hermes", "llama3_json"}
    assert [int(e) for e in CallError] == [0, 1, 2, 3, 4, 5]


def _random_value(rng, depth=0):
    kind = rng.choice(["str", "int", "float", "bool", "none", "list", "dict"][: 5 if depth > 1 else 7])
    if kind == "str":
        pool = 'abc xyz"\'\\/{}[]:;,\n\t<>éß東京語😀🎉\u2028\x00\x7f'
        return "".join(rng.choice(pool) for _ in range(rng.randint(0, 12)))
    if kind == "int":
        return rng.randint(-10**12, 10**12)
    if kind == "float":
        return rng.uniform(-1e6, 1e6)
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "none":
        return None
    if kind == "list":
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {str(_random_value(rng, 2)) if rng.random() < 0.5 else "k": _random_value(rng, depth + 1)
            for _ in range(rng.randint(0, 3))}


def test_property_rendered_calls_parse_back():
    anything = ToolSet([Tool("echo", "Echo.", {"type": "object", "properties": {},
                                               "additionalProperties": True}, lambda **kw: kw)])
    rng = random.Random(1)
    for i in range(300):
        args = {str(_random_value(rng, 2)): _random_value(rng) for _ in range(rng.randint(0, 5))}
        body = json.dumps({"name": "echo", "arguments": args}, ensure_ascii=i % 2 == 0,
                          indent=None if i % 3 else 2)
        t = parse_turn(f"pre\n<tool_call>\n{body}\n</tool_call><|im_end|>", anything)
        assert [c.arguments for c in t.ok_calls] == [args] and t.content == "pre"
        llama = parse_turn(json.dumps({"name": "echo", "parameters": args}), anything, syntax="llama3_json")
        assert [c.arguments for c in llama.ok_calls] == [args] and llama.content == ""


# --------------------------------------------------------------------------- llama3_json

def test_llama3_json():
    (c,) = parse('<|python_tag|>{"name": "get_weather", "parameters": {"city": "a;b"}}<|eom_id|>', "llama3_json").calls
    assert c.ok and c.arguments == {"city": "a;b"}
    (c,) = parse('{"arguments": {"city": "x"}, "name": "get_weather"}<|eot_id|>', "llama3_json").calls
    assert c.ok and c.arguments == {"city": "x"}
    t = parse('{"name": "now", "parameters": {}}; {"name": "get_weather", "parameters": {"city": "y"}} ;'
              '{"name": "foo", "parameters": {}}', "llama3_json")
    assert [(c.name, c.error) for c in t.calls] == [("now", E.NONE), ("get_weather", E.NONE), ("foo", E.UNKNOWN_TOOL)]
    t = parse('The answer is {"name": "now"}<|eot_id|>', "llama3_json")
    assert (t.content, t.calls) == ('The answer is {"name": "now"}', ())


def test_llama3_json_errors():
    assert parse('{"name": "now", "parameters": {,}}', "llama3_json").calls[0].error == E.BAD_JSON
    t = parse('{"name": "get_weather", "parameters": {"city": "Pa', "llama3_json")
    assert [(c.name, c.error) for c in t.calls] == [("get_weather", E.INCOMPLETE)]
    assert parse('{"name": "get_weather", "parameters": {}}', "llama3_json").calls[0].error == E.MISSING_ARGUMENT
    t = parse('{"name": "now", "parameters": {}} Anything else?', "llama3_json")
    assert t.calls[0].ok and t.content == "Anything else?"


# --------------------------------------------------------------------------- Tool / ToolSet

def test_from_function_schema():
    assert WEATHER.schema() == {"type": "function", "function": {
        "name": "get_weather", "description": "Get the weather forecast of a city.",
        "parameters": {"type": "object", "required": ["city"], "properties": {
            "city": {"type": "string", "description": "The city name, e.g. Paris."},
            "unit": {"type": "string", "enum": ["c", "f"], "description": "The temperature unit."},
            "days": {"type": "integer", "description": "How many days."}}}}}

    def f(xs: list[int], ratio: float, flag: bool, tag: str | None = None, mode: Literal[1, "a"] = 1,
          **extra) -> str:
        """Do f."""
    params = Tool.from_function(f, name="g", description="Other.").parameters
    assert params == {"type": "object", "required": ["xs", "ratio", "flag"], "additionalProperties": True,
                      "properties": {"xs": {"type": "array", "items": {"type": "integer"}},
                                     "ratio": {"type": "number"}, "flag": {"type": "boolean"},
                                     "tag": {"type": ["string", "null"]},
                                     "mode": {"type": ["integer", "string"], "enum": [1, "a"]}}}


def test_from_function_errors():
    def bad_hint(x: set[int]):
        """Doc."""
    def no_hint(x):
        """Doc."""
    def no_doc(x: int): ...
    with pytest.raises(TypeError, match="'x'.*unsupported type hint"):
        Tool.from_function(bad_hint)
    with pytest.raises(TypeError, match="no type hint"):
        Tool.from_function(no_hint)
    with pytest.raises(ValueError, match="no description"):
        Tool.from_function(no_doc)
    assert Tool.from_function(no_doc, description="D").description == "D"


@pytest.mark.parametrize("name, params, match", [
    ("bad name", {"type": "object", "properties": {}}, "name"),
    ("9lives", {"type": "object", "properties": {}}, "name"),
    ("t", {"type": "array"}, "JSON Schema object"),
    ("t", {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"]}, r"\['b'\]"),
    ("t", {"type": "object", "properties": {"a": {"type": "strnig"}}}, "invalid parameters schema"),
])
def test_tool_validation(name, params, match):
    with pytest.raises(ValueError, match=match) as e:
        Tool(name, "d", params, lambda: "")
    assert repr(name) in str(e.value)


def test_toolset_and_invoke():
    with pytest.raises(ValueError, match="duplicate tool name 'now'"):
        ToolSet([TOOLS["now"], Tool.from_function(now)])
    assert list(TOOLS) == ["get_weather", "now"] and len(TOOLS) == 2 and "now" in TOOLS
    assert [s["function"]["name"] for s in TOOLS.schemas()] == ["get_weather", "now"]
    assert TOOLS["now"].invoke({}) == '{"time": "12:00", "zone": "東京"}'
    assert WEATHER.invoke({"city": "Oslo"}) == "Oslo: 21c for 1d"
    assert validate_arguments(WEATHER, [1])[0] == E.BAD_ARGUMENT


# --------------------------------------------------------------------------- runner

def _tool(name, fn):
    return Tool(name, name, {"type": "object", "properties": {"x": {}}, "additionalProperties": True}, fn)


def _ok(name, **args):
    return ToolCall(name, args)


def test_runner_order_errors_and_concurrency():
    barrier = threading.Barrier(3, timeout=5)  # only passes if the three calls overlap

    def wait_then(x):
        barrier.wait()
        return x

    def boom(x):
        raise ValueError(f"bad {x}")

    tools = [_tool("wait", wait_then), _tool("boom", boom), _tool("obj", lambda x: object())]
    bad = parse_turn(call({"name": "nope"}), ToolSet(tools)).calls[0]
    with ToolRunner(tools, timeout_s=10) as runner:
        res = runner.run([_ok("wait", x="a"), _ok("boom", x=1), bad, _ok("wait", x={"k": "é"}),
                          _ok("obj", x=0), _ok("wait", x=3), _ok("ghost")])
    assert [r.text for r in res] == [
        "a", "Error: ValueError: bad 1", "Error: unknown tool 'nope'. Available tools: wait, boom, obj.",
        '{"k": "é"}', "Error: TypeError: Object of type object is not JSON serializable", "3",
        "Error: unknown tool 'ghost'. Available tools: wait, boom, obj."]
    assert [r.ok for r in res] == [True, False, False, True, False, True, False]
    assert all(isinstance(r, ToolResult) and r.seconds >= 0 for r in res)


def test_runner_timeout_returns_before_the_slow_tool_finishes():
    release, finished = threading.Event(), threading.Event()

    def slow(x):
        release.wait(10)
        finished.set()
        return "late"

    runner = ToolRunner([_tool("slow", slow), _tool("fast", lambda x: f"fast {x}")], max_workers=1, timeout_s=0.2)
    try:
        res = runner.run([_ok("slow", x=0)])
        assert not finished.is_set()
        assert [(r.text, r.ok) for r in res] == [("Error: tool 'slow' timed out after 0.2s.", False)]
        # the only worker is still stuck: the next run gets a fresh pool
        assert [r.text for r in runner.run([_ok("fast", x=1)])] == ["fast 1"]
        assert not finished.is_set()
    finally:
        release.set()
        runner.close()
    with pytest.raises(RuntimeError, match="closed"):
        runner.run([])


def test_run_many_overlaps_turns():
    barrier = threading.Barrier(4, timeout=5)

    def meet(x):
        barrier.wait()
        return f"t{x}"

    tools = [_tool("meet", meet)]
    turns = [[_ok("meet", x=0), _ok("meet", x=1)], [], [_ok("meet", x=2)], [_ok("meet", x=3)]]
    with ToolRunner(tools, max_workers=4, timeout_s=10) as runner:
        res = runner.run_many(turns)
    assert [[r.text for r in row] for row in res] == [["t0", "t1"], [], ["t2"], ["t3"]]
