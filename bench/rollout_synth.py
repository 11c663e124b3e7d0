"""A generated tool environment in the text swarm (``python bench/rollout.py --text --env synth
[--json]``): the jitted engine against the host-driven rollout on identical episodes, and
how much of the engine's tick is the environment's logic against the model's.

Workload: a task set generated here (8 domains, two kinds each, nothing downloaded); the
environment with the most tasks; ``--batch`` (32) of its recorded tasks (reads, computes,
writes; one and two parts), with a Qwen3 chat format and a byte-level BPE trained on the
task set (vocab 2000); the ~1M model (preset ``1m`` with the tokenizer's vocabulary). The
orchestrator's turns are scripted like a trained single agent (each recorded call in its
own turn, then the answer), so both sides run the same episodes; the model still runs
every step on both sides, and the benchmark checks that the ids, counts and rewards are
identical.

* ``jit``: :class:`swarmjax.swarm.text_engine.TextSwarm` over
  :class:`swarmjax.envs.synth.device_task.SynthDeviceTask`: tool calls parsed, executed on
  the tables and answered on the device.
* ``host``: :class:`swarmjax.swarm.text_rollout.TextRollout` with the host twin
  :class:`~swarmjax.envs.synth.device_task.SynthTwinEnv` (the host tools in Python).
* the tick's split: the call parser's step on every row (every tick), the turn ends
  (calls executed on the tables, responses rendered and joined: once per turn that ends,
  counted as if each turn ended on a tick of its own, an upper bound), each timed alone
  at the engine's shapes, against the engine's time per tick.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import matmul_peak_flops, time_best  # noqa: E402

from swarmjax.envs.synth.device_task import SynthDeviceTask  # noqa: E402
from swarmjax.envs.synth.task import SynthToolTask, answer_text  # noqa: E402
from swarmjax.envs.synth.generator import SynthConfig  # noqa: E402
from swarmjax.models.config import preset  # noqa: E402
from swarmjax.models.transformer import init_params  # noqa: E402
from swarmjax.roles import Roles  # noqa: E402
from swarmjax.sampling.processors import SamplingConfig  # noqa: E402
from swarmjax.swarm.text_engine import TextSwarm  # noqa: E402
from swarmjax.swarm.text_rollout import TextRollout  # noqa: E402
from swarmjax.swarm.text_types import SwarmConfig, TextRolloutConfig, TextScripts  # noqa: E402
from swarmjax.text.device import calls as dc  # noqa: E402
from swarmjax.text.bpe import train_bpe_tokenizer  # noqa: E402
from swarmjax.text.chat import Qwen3Format, chat_format  # noqa: E402
from swarmjax.text.fragments import render  # noqa: E402
from swarmjax.text.tokenizer import TextTokenizer  # noqa: E402

CFG = SynthConfig(domains=8, kinds=(2, 2), categories=(1, 1), measures=(1, 1), tasks=480, held_out=0.0,
                  max_parts=2, seed=0)


def script(chat, record) -> list[np.ndarray]:
    """A trained single agent's turns: each recorded call in its own turn, then the answer."""
    parts = record["parts"]
    calls = [chat.assistant_ids("", [{"name": c["name"], "arguments": c["arguments"]}])
             for p in parts for c in p["calls"]]
    answer = answer_text(parts[0]["answer"]) if len(parts) == 1 else "\n".join(
        f"{i + 1}: {answer_text(p['answer'])}" for i, p in enumerate(parts))
    return calls + [chat.assistant_ids(answer)]


def tick_split(dt: SynthDeviceTask, scripts: TextScripts, repeats: int) -> dict:
    """Seconds of the parser's step over the batch's rows (one tick) and of one turn end
    (every row's calls run, rendered and joined), at the engine's shapes."""
    g = dt.grammar("orchestrator")
    turns = [t for s in scripts.orch for t in s[:-1]]                    # the call turns
    B = len(scripts.orch)
    ids = np.zeros((B, max(len(t) for t in turns)), np.int32)
    lens = np.zeros((B,), np.int32)
    for b in range(B):
        t = turns[b % len(turns)]
        ids[b, :len(t)], lens[b] = t, len(t)
    state = dc.parse_tokens(g, jnp.asarray(ids), jnp.asarray(lens))       # every row's parsed turn
    rec, count = dc.call_record(g, state), state.count
    step = jax.jit(lambda st, tok: dc.step(g, st, tok, jnp.ones((B,), bool)))
    fresh = dc.init(g, B)
    tok = jnp.asarray(ids[:, 0])
    run_step = lambda: jax.block_until_ready(step(fresh, tok))            # noqa: E731
    run_step()
    arrays, _ = dt.batch([r for r in RECORDS[:B]])
    tables = dt.init(jax.tree.map(jnp.asarray, arrays))

    @jax.jit
    def turn_end(tables, rec, count):
        tables, out = dt.orch_turn(tables, rec, count, jnp.ones((B,), bool))
        seq = jax.vmap(dt.reply_seq)(out.grid, out.responses, jnp.zeros((B,), bool))
        return tables, render(dt.frags, seq, width=dt.widths["reply"])
    run_end = lambda: jax.block_until_ready(turn_end(tables, rec, count))  # noqa: E731
    run_end()
    return {"parser_step_s": time_best(run_step, repeats), "turn_end_s": time_best(run_end, repeats)}


RECORDS: list = []


def setup(batch: int, *, corpus: tuple[str, ...] = ()):
    """The workload (module docstring): (environment name, its first ``batch`` recorded
    tasks, chat format, device task, model config, params, rollout config). ``corpus``:
    more text for the tokenizer."""
    task = SynthToolTask(cfg=CFG)
    records = [r for s in ("train", "seen") for r in task.records(s)]
    by_env: dict[str, list] = {}
    for r in records:
        by_env.setdefault(r["env"], []).append(r)
    name = max(sorted(by_env), key=lambda n: len(by_env[n]))
    if len(by_env[name]) < batch:
        raise SystemExit(f"environment {name} has {len(by_env[name])} tasks, fewer than --batch {batch}")
    texts = task.corpus() + [Qwen3Format.TOOLS_HEAD, Qwen3Format.TOOLS_TAIL] * 5 + list(corpus)
    with tempfile.TemporaryDirectory() as d:
        tok = TextTokenizer.from_dir(train_bpe_tokenizer(texts, d, vocab_size=2000))
    chat = chat_format("qwen3", tok)
    dt = SynthDeviceTask(task.envs()[name], chat)
    mcfg = preset("1m").replace(vocab_size=tok.vocab_size)
    greedy = SamplingConfig(temperature=0.0)
    rcfg = TextRolloutConfig(contexts=Roles(len(dt.head_ids("orchestrator")) + 1024, 64),
                             max_turn_tokens=160, subagent_lanes=1, subagent_turns=1, budget=None,
                             sampling=Roles.both(greedy))
    return name, by_env[name][:batch], chat, dt, mcfg, init_params(mcfg, jax.random.key(0)), rcfg


def main(argv=None):
    import argparse

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--text", action="store_true", help="(the flag bench/rollout.py dispatches on)")
    p.add_argument("--env", choices=["synth"], default="synth")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--chunk", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    t0 = time.perf_counter()
    name, records, chat, dt, mcfg, params, rcfg = setup(args.batch)
    build_s = time.perf_counter() - t0
    tok = chat.tokenizer
    RECORDS[:] = records
    scripts = TextScripts(orch=[script(chat, r) for r in RECORDS])
    head = len(dt.head_ids("orchestrator"))
    peak = matmul_peak_flops()

    engine = TextSwarm(dt, mcfg, rcfg, swarm=SwarmConfig(chunk=args.chunk))
    run_jit = lambda: engine(Roles.both(params), RECORDS, jax.random.key(0), scripts=scripts)   # noqa: E731
    t0 = time.perf_counter()
    got = run_jit()
    jit_first = time.perf_counter() - t0
    jit_s = time_best(run_jit, args.repeats)

    host = TextRollout(mcfg, rcfg, stop_ids=chat.stop_ids, pad_id=tok.token_id(chat.pad_token))
    run_host = lambda: host(Roles.both(params), [dt.orchestrator(r) for r in RECORDS],  # noqa: E731
                            [None] * len(RECORDS),
                            jax.random.key(0), scripts=scripts)
    t0 = time.perf_counter()
    want = run_host()
    host_first = time.perf_counter() - t0
    host_s = time_best(run_host, args.repeats)
    st = run_host().stats
    host.close()

    same = (np.array_equal(got.tokens, want.tokens) and np.array_equal(got.length, want.length)
            and all(np.array_equal(getattr(got, k), getattr(want, k)) for k in
                    ("orch_steps", "critical_steps", "total_steps", "end_reason"))
            and all(np.allclose(got.rewards[k], v) for k, v in want.rewards.items() if k in got.rewards))
    if not same:
        raise SystemExit("the jitted engine and the host-driven rollout disagree on an episode")
    split = tick_split(dt, scripts, max(args.repeats, 10))
    B, ticks, turns = args.batch, got.stats["ticks"], int(got.orch_steps.sum())
    env_s = ticks * split["parser_step_s"] + turns * split["turn_end_s"]
    figures = {
        "jax": jax.__version__, "backend": jax.default_backend(), "env": name, "tools": len(dt.env.tools),
        "batch": B, "chunk": args.chunk, "params": mcfg.num_params(), "peak_flops": peak,
        "prompt_head_ids": head, "setup_s": build_s, "ratio": host_s / jit_s, "jit_s": jit_s,
        "host_s": host_s, "jit_compile_s": jit_first - jit_s, "host_first_call_s": host_first,
        "jit_episodes_s": B / jit_s, "host_episodes_s": B / host_s, "ticks": ticks, "turns": turns,
        "tick_ms": 1e3 * jit_s / ticks, "parser_step_ms": 1e3 * split["parser_step_s"],
        "turn_end_ms": 1e3 * split["turn_end_s"], "env_share_of_jit": env_s / jit_s,
        "mean_r_perf": float(got.rewards["r_perf"].mean()), "identical_episodes": same,
        "host_segments": st["segments"], "host_device_s": st["decode_s"] + st["prefill_s"],
        "host_other_s": st["total_s"] - st["decode_s"] - st["prefill_s"],
    }
    if args.json:
        print(json.dumps(figures))
        return
    print(f"jax {figures['jax']} on {figures['backend']} (matmul peak {peak / 1e9:.1f} GFLOP/s), {B} tasks of the "
          f"generated environment {name} ({len(dt.env.tools)} tools; shared prompt head {head} ids), model 1m "
          f"({mcfg.num_params() / 1e6:.2f}M), set up (task set, tokenizer, device task) in {build_s:.1f} s, mean r_perf "
          f"{figures['mean_r_perf']:.2f}")
    print(f"{'':12}{'s/batch':>10}{'episodes/s':>12}{'first call s':>14}")
    print(f"{'jit':12}{jit_s:10.3f}{B / jit_s:12.1f}{jit_first:14.2f}")
    print(f"{'host':12}{host_s:10.3f}{B / host_s:12.1f}{host_first:14.2f}")
    print(f"ratio jit/host episodes/s: {figures['ratio']:.2f}x (identical episodes: {same}); host: "
          f"{figures['host_other_s']:.3f} s of {st['total_s']:.3f} s outside its decode and prefill phases")
    print(f"jit tick {figures['tick_ms']:.2f} ms ({ticks} ticks, {turns} turns): parser step "
          f"{figures['parser_step_ms']:.3f} ms a tick, a turn end {figures['turn_end_ms']:.3f} ms (all {B} rows); "
          f"environment logic <= {100 * figures['env_share_of_jit']:.1f}% of the jitted rollout")


if __name__ == "__main__":
    main()
