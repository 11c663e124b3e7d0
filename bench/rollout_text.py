"""Text swarm rollout benchmark (``python bench/rollout.py --text [--json]``; ``--env synth``:
a generated tool environment instead, bench/rollout_synth.py): the
jitted text swarm vs the host-driven text rollout, on identical episodes, and what
text costs against the token world, and where the host-driven rollout's time goes (its
round trips, the share of its wall outside its decode and prefill phases: the most any
rollout without round trips could gain while doing the host's device work).

Workload: ``--batch`` (32) canonical text wide-search episodes
(:mod:`swarmjax.envs.widesearch_relay`: E = V = 32, n = 1..8, K = 4, S_sub = 3) with a
Qwen3 chat format and a byte-level BPE trained here (vocab 1000, nothing downloaded),
the ~1M model (preset ``1m`` with the tokenizer's vocabulary) as orchestrator and
sub-agents. The agents' turns are scripted like a trained swarm policy (as
``bench/rollout.py``: half the episodes split the task over min(4, ceil(n/2))
sub-agents, a quarter over 4, a quarter serial) so both sides run the same episodes;
the model still runs every step on both sides, and the benchmark checks the
orchestrators' ids, the counts and the rewards are identical.

* ``jit``: :class:`swarmjax.swarm.text_engine.TextSwarm`, the whole rollout in one
  ``lax.while_loop``, tool calls parsed and answered on the device.
* ``host``: :class:`swarmjax.swarm.text_rollout.TextRollout` with the host twin
  :class:`~swarmjax.envs.widesearch_relay.RelayEnv` (one sub-agent lane per slot).
* ``token world``: :class:`swarmjax.swarm.engine.SwarmRollout` on the same episodes
  (same sizes, same scripted policies in the token protocol), the ~1M model with the
  task vocabulary: tokens and time per episode.
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import matmul_peak_flops, time_best  # noqa: E402

from swarmjax.envs import scripts as token_scripts  # noqa: E402
from swarmjax.envs import widesearch_jax as wsj  # noqa: E402
from swarmjax.envs.widesearch import Episode, Vocab, WideSearchConfig  # noqa: E402
from swarmjax.envs.widesearch_relay import RelayTask, relay_corpus  # noqa: E402
from swarmjax.envs.widesearch_relay_device import RelayDeviceTask  # noqa: E402
from swarmjax.models.config import preset  # noqa: E402
from swarmjax.models.transformer import init_params  # noqa: E402
from swarmjax.roles import Roles  # noqa: E402
from swarmjax.sampling.processors import SamplingConfig  # noqa: E402
from swarmjax.swarm.engine import RolloutConfig, SwarmRollout  # noqa: E402
from swarmjax.swarm.text_engine import TextSwarm  # noqa: E402
from swarmjax.swarm.text_rollout import TextRollout  # noqa: E402
from swarmjax.swarm.text_types import SwarmConfig, TextRolloutConfig, TextScripts  # noqa: E402
from swarmjax.text.bpe import train_bpe_tokenizer  # noqa: E402
from swarmjax.text.chat import Qwen3Format, chat_format  # noqa: E402
from swarmjax.text.tokenizer import TextTokenizer  # noqa: E402

CFG = WideSearchConfig(num_entities=32, num_values=32, min_task_size=1, max_task_size=8, max_subagents=4,
                       subagent_steps=3, budget=None)


def workload(task: RelayTask, batch: int, seed: int = 0):
    """Episodes, their parts (1: serial) and the text scripts of both roles."""
    rng = random.Random(seed)
    eps, parts, orch, workers = [], [], [], []
    for b in range(batch):
        ep = Episode.sample(CFG, rng)
        n, style = len(ep.task), b % 4
        k = 1 if n == 1 or style == 3 else (4 if style == 2 else min(CFG.max_subagents, math.ceil(n / 2)))
        k = min(k, n)
        o, w = (task.serial_script(ep), []) if k == 1 else task.split_script(ep, k)
        eps.append(ep)
        parts.append(k)
        orch.append(o)
        workers.append(w)
    return eps, parts, TextScripts(orch=orch, workers=workers)


def token_world(eps, parts, repeats: int) -> dict:
    """The same episodes and policies in the token world: sampled+heard tokens and time."""
    vocab = Vocab(CFG)
    mcfg = preset("1m").replace(vocab_size=vocab.size)
    params = init_params(mcfg, jax.random.key(0))
    orch, workers = [], []
    for ep, k in zip(eps, parts):
        o, w = (token_scripts.serial(CFG, ep), []) if k == 1 else token_scripts.split(CFG, ep, k)
        orch.append(o)
        workers.append(w)
    from rollout import to_scripts  # noqa: E402  (the token bench's packing)
    sc = to_scripts(orch, workers, CFG.max_subagents)
    tasks = wsj.Tasks(table=jnp.asarray([e.table for e in eps], jnp.int32),
                      entities=jnp.asarray([e.task + [-1] * (CFG.max_task_size - len(e.task)) for e in eps], jnp.int32),
                      n=jnp.asarray([len(e.task) for e in eps], jnp.int32))
    engine = SwarmRollout(RolloutConfig(env=CFG), mcfg)
    run = lambda: jax.block_until_ready(engine(Roles.both(params), tasks, jax.random.key(0), scripts=sc))
    result = run()
    seconds = time_best(run, repeats)
    tokens = int(np.sum(np.asarray(result.length)) + np.sum(np.asarray(result.worker_length)))
    return {"seconds": seconds, "tokens": tokens}


def main(argv=None):
    import argparse

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--text", action="store_true", help="(the flag bench/rollout.py dispatches on)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--chunk", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", action="store_true")
    p.add_argument("--env", choices=["relay", "synth"], default="relay",
                   help="synth: a generated tool environment (bench/rollout_synth.py)")
    args, _ = p.parse_known_args(argv)
    if args.env == "synth":
        from rollout_synth import main as synth_main
        return synth_main(argv)
    args = p.parse_args(argv)

    texts = relay_corpus(CFG) + [Qwen3Format.TOOLS_HEAD, Qwen3Format.TOOLS_TAIL] * 5
    with tempfile.TemporaryDirectory() as d:
        tok = TextTokenizer.from_dir(train_bpe_tokenizer(texts, d, vocab_size=1000))
    chat = chat_format("qwen3", tok)
    task = RelayTask(CFG, chat, max_calls=8, max_mentions=8, max_pairs=8)
    mcfg = preset("1m").replace(vocab_size=tok.vocab_size)
    params = init_params(mcfg, jax.random.key(0))
    eps, parts, scripts = workload(task, args.batch)
    greedy = SamplingConfig(temperature=0.0)
    rcfg = TextRolloutConfig(contexts=Roles(1024, 512), max_turn_tokens=160,
                             subagent_lanes=args.batch * CFG.max_subagents, subagent_turns=CFG.subagent_steps,
                             budget=None, sampling=Roles.both(greedy))
    peak = matmul_peak_flops()

    engine = TextSwarm(RelayDeviceTask(task), mcfg, rcfg, swarm=SwarmConfig(chunk=args.chunk))
    run_jit = lambda: engine(Roles.both(params), eps, jax.random.key(0), scripts=scripts)
    t0 = time.perf_counter()
    got = run_jit()
    jit_first = time.perf_counter() - t0
    jit_s = time_best(run_jit, args.repeats)
    # the same program with one key split per tick for the whole batch (the text PARL
    # recipe's): what keying every token by its episode, agent and position costs
    batch_keyed = TextSwarm(RelayDeviceTask(task), mcfg, rcfg,
                            swarm=SwarmConfig(chunk=args.chunk, episode_keys=False))
    run_batch_keyed = lambda: batch_keyed(Roles.both(params), eps, jax.random.key(0), scripts=scripts)  # noqa: E731
    run_batch_keyed()
    batch_keyed_s = time_best(run_batch_keyed, args.repeats)

    host = TextRollout(mcfg, rcfg, stop_ids=chat.stop_ids, pad_id=tok.token_id(chat.pad_token))
    run_host = lambda: host(Roles.both(params), [task.orchestrator(ep) for ep in eps], [None] * len(eps),
                            jax.random.key(0), scripts=scripts)
    t0 = time.perf_counter()
    want = run_host()
    host_first = time.perf_counter() - t0
    host_s = time_best(run_host, args.repeats)
    st = run_host().stats          # where the host's time goes (one more warm call)
    host.close()

    same = (np.array_equal(got.tokens, want.tokens) and np.array_equal(got.length, want.length)
            and all(np.array_equal(getattr(got, k), getattr(want, k)) for k in
                    ("critical_steps", "total_steps", "spawned", "finished", "end_reason"))
            and all(np.allclose(got.rewards[k], v) for k, v in want.rewards.items()))
    if not same:
        raise SystemExit("the jitted text swarm and the host-driven rollout disagree on an episode")
    tokens = int(got.length.sum() + sum(len(s) for subs in got.subagents for s in subs))
    tw = token_world(eps, parts, args.repeats)
    B = args.batch
    figures = {
        "jax": jax.__version__, "backend": jax.default_backend(), "batch": B, "chunk": args.chunk,
        "params": mcfg.num_params(), "peak_flops": peak, "ratio": host_s / jit_s,
        "jit_episodes_s": B / jit_s, "host_episodes_s": B / host_s, "tokens_per_episode": tokens / B,
        "jit_s": jit_s, "jit_one_key_a_tick_s": batch_keyed_s, "episode_keys_cost": jit_s / batch_keyed_s,
        "host_s": host_s, "jit_compile_s": jit_first - jit_s, "host_first_call_s": host_first,
        "ticks": got.stats["ticks"], "mean_critical_steps": float(got.critical_steps.mean()),
        "mean_subagents": float(got.spawned.mean()), "identical_episodes": same,
        "token_world_tokens_per_episode": tw["tokens"] / B, "token_world_episodes_s": B / tw["seconds"],
        "text_over_token_tokens": tokens / tw["tokens"], "text_over_token_time": jit_s / tw["seconds"],
        # the host's round trips per batch, the time of its decode and prefill phases (their
        # device work, dispatch and the chunks' packing) and the rest of its wall (tool calls
        # parsed and answered, the rollout's bookkeeping in Python): the rest is all a rollout
        # with no round trip could save while doing the host's device work, so total over
        # host_device_s bounds its ratio
        "host_segments": st["segments"], "host_prefill_calls": st["prefill_calls"],
        "host_device_s": st["decode_s"] + st["prefill_s"],
        "host_other_s": st["total_s"] - st["decode_s"] - st["prefill_s"],
        "ratio_bound_same_device_work": st["total_s"] / (st["decode_s"] + st["prefill_s"]),
    }
    if args.json:
        print(json.dumps(figures))
        return
    print(f"jax {figures['jax']} on {figures['backend']} (matmul peak {peak / 1e9:.1f} GFLOP/s), {B} text episodes "
          f"(n = 1..8), model 1m ({mcfg.num_params() / 1e6:.2f}M), {figures['tokens_per_episode']:.0f} tokens "
          f"per episode, mean critical steps {figures['mean_critical_steps']:.2f}, "
          f"mean sub-agents {figures['mean_subagents']:.2f}")
    print(f"{'':12}{'s/batch':>10}{'episodes/s':>12}{'first call s':>14}")
    print(f"{'jit text':12}{jit_s:10.3f}{B / jit_s:12.1f}{jit_first:14.2f}")
    print(f"{'jit 1 key':12}{batch_keyed_s:10.3f}{B / batch_keyed_s:12.1f}   (one key a tick, not per episode: "
          f"episode keys cost {figures['episode_keys_cost']:.2f}x)")
    print(f"{'host text':12}{host_s:10.3f}{B / host_s:12.1f}{host_first:14.2f}")
    print(f"{'token world':12}{tw['seconds']:10.3f}{B / tw['seconds']:12.1f}")
    print(f"ratio jit/host episodes/s: {figures['ratio']:.2f}x (identical episodes: {same}); text costs "
          f"{figures['text_over_token_tokens']:.1f}x the token world's tokens per episode "
          f"({figures['tokens_per_episode']:.0f} vs {figures['token_world_tokens_per_episode']:.0f}) and "
          f"{figures['text_over_token_time']:.1f}x its time")
    print(f"host: {st['segments']} decode segments and {st['prefill_calls']} prefill calls per batch; outside its "
          f"decode and prefill phases (tool calls, bookkeeping) {figures['host_other_s']:.3f} s of "
          f"{st['total_s']:.3f} s: with the host's device work and no round trip, a rollout reaches at most "
          f"{figures['ratio_bound_same_device_work']:.2f}x")


if __name__ == "__main__":
    main()
