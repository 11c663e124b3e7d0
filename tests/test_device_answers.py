"""The device answer-line parser (swarmjax.text.device.answers) agrees with its host twin
on hand-written turns and on a fuzz of mutated answer texts, each tokenised canonically
and with random byte-boundary splits, with control ids between and inside lines. The
tokenizer is a byte-level BPE trained here on the wide-search corpus."""

import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from swarmjax.envs.widesearch import WideSearchConfig
from swarmjax.envs.widesearch_text import format_pairs, generate_names, text_corpus
from swarmjax.text.device import answers as da
from swarmjax.text.bpe import train_bpe_tokenizer
from swarmjax.text.byte_tries import token_byte_table
from swarmjax.text.tokenizer import TextTokenizer

from splitter import Splitter

CFG = WideSearchConfig(num_entities=24, num_values=24, max_task_size=8, max_subagents=4, budget=None)
ENTS = generate_names(CFG.num_entities, seed=0, style="entity")
VALS = generate_names(CFG.num_values, seed=1, style="value")
P = 6


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return TextTokenizer.from_dir(train_bpe_tokenizer(text_corpus(CFG), tmp_path_factory.mktemp("tok"),
                                                      vocab_size=700))


@pytest.fixture(scope="module")
def ctx(tok):
    """(grammar, control ids, byte table, jitted parse_tokens)."""
    ctrl = sorted(tok.added_tokens.values())
    g = da.AnswerGrammar.build(tok, ENTS, VALS, control_ids=ctrl, max_pairs=P)
    return g, ctrl, token_byte_table(tok), jax.jit(da.parse_tokens)


def encode(segments, fn):
    """Ids of segments (text, or an int control id), each text encoded by fn."""
    return [i for seg in segments for i in ([seg] if isinstance(seg, int) else fn(seg))]


def run(ctx, rows):
    """Device (pairs [n, P, 2], count [n]) of id lists, one padded batch."""
    g, _, _, parse = ctx
    t = max(len(x) for x in rows) + 1
    ids, lengths = np.zeros([len(rows), t], np.int32), np.zeros([len(rows)], np.int32)
    for i, row in enumerate(rows):
        ids[i, :len(row)], lengths[i] = row, len(row)
    got, count = da.pairs(parse(g, jnp.asarray(ids), jnp.asarray(lengths)))
    return np.asarray(got), np.asarray(count)


def host(ctx, tok, ids):
    _, ctrl, table, _ = ctx
    return da.host_answer_pairs(tok, ids, ENTS, VALS, control_ids=ctrl, byte_table=table)


def check(got, count, want):
    rec = np.full([P, 2], -1, np.int32)
    if want[:P]:
        rec[:min(P, len(want))] = want[:P]
    assert int(count) == len(want)
    np.testing.assert_array_equal(got, rec)


# --------------------------------------------------------------------------- hand-written

def test_canonical_answers(tok, ctx):
    r = random.Random(0)
    cases = [[(e, r.randrange(len(VALS))) for e in r.sample(range(len(ENTS)), r.randint(1, P))] for _ in range(8)]
    texts = [format_pairs(ENTS, VALS, c) for c in cases]
    got, count = run(ctx, [tok.encode(s).tolist() for s in texts])
    for c, s, gi, ci in zip(cases, texts, got, count):
        assert da.answer_pairs_from_text(s, ENTS, VALS) == c
        assert host(ctx, tok, tok.encode(s).tolist()) == c
        check(gi, ci, c)


def test_hand_written_turn(tok, ctx):
    e, v = ENTS, VALS
    end, think = tok.added_tokens["<|im_end|>"], tok.added_tokens["<think>"]
    segments = [f"  {e[0]} :\t{v[0]}  \n{e[1]}:{v[1]}\nno colon here\n{e[2]}: {v[7]}: extra\n: {v[0]}\n{e[3]}:\n",
                f"{e[0][:-1]}: {v[1]}\n{e[1]}\r: {v[2]}\nNobody: {v[3]}\n{e[4]}: {v[4]}\r\n{v[5]}: {e[5]}\n",
                f"{e[5]}: ", end, f" {v[5]}\n\t{e[6]}\t:\t{v[6]}\t", think, "more words", end]
    # 12 pairs: with max_pairs P all are counted, the first P recorded
    want = [(0, 0), (1, 1), (2, -1), (-1, 0), (3, -1), (-1, 1), (-1, 2), (-1, 3), (4, -1), (-1, -1), (5, -1),
            (6, 6)]
    ids = encode(segments, lambda s: tok.encode(s).tolist())
    assert host(ctx, tok, ids) == want
    assert da.answer_pairs_from_text("".join("\n" if isinstance(s, int) else s for s in segments),
                                     ENTS, VALS) == want
    (got,), (count,) = run(ctx, [ids])
    assert count == len(want)
    np.testing.assert_array_equal(got, np.asarray(want[:P]))
    wide = da.AnswerGrammar.build(tok, ENTS, VALS, control_ids=ctx[1], max_pairs=16)
    got, count = da.pairs(ctx[3](wide, jnp.asarray([ids]), jnp.asarray([len(ids)])))
    assert int(count[0]) == len(want)
    np.testing.assert_array_equal(np.asarray(got[0, :len(want)]), np.asarray(want))
    assert (np.asarray(got[0, len(want):]) == -1).all()


def test_overflow_counts_all_records_first(tok, ctx):
    ctrl = ctx[1]
    small = da.AnswerGrammar.build(tok, ENTS, VALS, control_ids=ctrl, max_pairs=2)
    want = [(i, (3 * i) % len(VALS)) for i in range(5)]
    ids = tok.encode(format_pairs(ENTS, VALS, want)).tolist()
    got, count = da.pairs(jax.jit(da.parse_tokens)(small, jnp.asarray([ids]), jnp.asarray([len(ids)])))
    assert int(count[0]) == 5
    np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[:2]))


def test_step_active_mask_and_reset(tok, ctx):
    """Ticking with inactive rows equals parse_tokens; reset restores init rows."""
    g = ctx[0]
    texts = [format_pairs(ENTS, VALS, [(1, 2), (3, 4)]), f"{ENTS[5]}: {VALS[6]}\nx"]
    rows = [tok.encode(s).tolist() for s in texts]
    step = jax.jit(da.step)
    st, pos, tick = da.init(g, 2), [0, 0], 0
    while pos[0] < len(rows[0]) or pos[1] < len(rows[1]):
        active = [pos[0] < len(rows[0]), pos[1] < len(rows[1]) and tick % 2 == 1]
        ids = [rows[i][pos[i]] if active[i] else 0 for i in range(2)]  # id 0 fed to inactive rows
        st = step(g, st, jnp.asarray(ids, jnp.int32), jnp.asarray(active))
        pos = [p + a for p, a in zip(pos, active)]
        tick += 1
    st = da.finish(g, st, jnp.ones(2, bool))
    got, count = da.pairs(st)
    check(np.asarray(got[0]), count[0], [(1, 2), (3, 4)])
    check(np.asarray(got[1]), count[1], [(5, 6)])
    st = da.reset(g, st, jnp.asarray([False, True]))
    check(np.asarray(st.pairs[1]), st.count[1], [])
    check(np.asarray(st.pairs[0]), st.count[0], [(1, 2), (3, 4)])


# --------------------------------------------------------------------------- fuzz

BLANK = ["", "", "", " ", "  ", "\t", " \t "]
ODD = ["é", "東京", "🚀", "\r", "\u00a0", "ß", ":", "\\n"]


def mutate_name(name, r):
    k = r.random()
    if k < .2:  # one char changed
        i = r.randrange(len(name))
        return name[:i] + r.choice("aZé:x ") + name[i + 1:]
    if k < .4:
        return name[:r.randint(0, len(name) - 1)]  # a strict prefix (maybe empty)
    if k < .5:
        return name + r.choice(["x", " x", "\r", "é"])
    if k < .6:
        return name.replace(" ", r.choice(["  ", "\t"]))
    if k < .7:
        return r.choice(["Nobody Here", "sub-nothing", "東京", "", "🚀 go"])
    if k < .8:
        return r.choice(ODD) + name
    return name + r.choice(ODD)


def line(r):
    k = r.random()
    if k < .08:
        return r.choice(["", "   ", "\t", "\r", "no colon here", ENTS[0], "::", ":"])
    e, v = r.choice(ENTS + VALS[:2]), r.choice(VALS + ENTS[:2])
    if r.random() < .35:
        e = mutate_name(e, r)
    if r.random() < .35:
        v = mutate_name(v, r)
    if k < .15:
        return e + r.choice(BLANK) + v  # no ':'
    colon = r.choice([":"] * 6 + ["::", ": :"])
    s = r.choice(BLANK) + e + r.choice(BLANK) + colon + r.choice(BLANK) + v + r.choice(BLANK)
    if r.random() < .1:
        s += r.choice([": extra", ":", " \r", "\r"])
    return s


def turn(r, ctrl):
    """(segments, the same text with control ids as '\\n')."""
    segments = []
    for i in range(r.randint(0, 9)):
        if i:
            segments.append(r.choice(ctrl) if r.random() < .2 else "\n")
        s = line(r)
        if s and r.random() < .1:  # a control id inside the line
            cut = r.randint(0, len(s))
            segments += [s[:cut], r.choice(ctrl), s[cut:]]
        else:
            segments.append(s)
    if r.random() < .2:
        segments.append(r.choice(["\n", r.choice(ctrl)]))
    text = "".join("\n" if isinstance(s, int) else s for s in segments)
    return segments, text


def test_fuzz_device_equals_host(tok, ctx):
    r, split = random.Random(1), Splitter(tok).chunks
    ctrl = ctx[1]
    rows, wants = [], []
    for _ in range(300):
        segments, text = turn(r, ctrl)
        want = da.answer_pairs_from_text(text, ENTS, VALS)
        for ids in (encode(segments, lambda s: tok.encode(s).tolist()), encode(segments, lambda s: split(s, r))):
            assert host(ctx, tok, ids) == want
            rows.append(ids)
            wants.append(want)
    got, count = run(ctx, rows)
    for gi, ci, want in zip(got, count, wants):
        check(gi, ci, want)
    # the fuzz is not vacuous: matches, misses on either side, and overflow all occur
    flat = [p for w in wants for p in w]
    assert sum(e >= 0 and v >= 0 for e, v in flat) > 200
    assert sum(e < 0 for e, _ in flat) > 50 and sum(v < 0 for _, v in flat) > 50
    assert sum(len(w) > P for w in wants) > 10
