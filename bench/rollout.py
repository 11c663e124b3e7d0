"""Swarm rollout benchmark: the one-jit engine vs a host-driven baseline.

    python bench/rollout.py            # table
    python bench/rollout.py --json     # one JSON object
    python bench/rollout.py --text     # the text swarm (bench/rollout_text.py)

Workload: 64 wide-search episodes with task sizes 1..16 (default sizes: E = V = 64,
K = 8, S_sub = 5, contexts 256 / 48, budget lifted), the ~1M model (preset ``1m``
with the task vocabulary) as orchestrator and sub-agents. The agents' choices are
scripted like a trained swarm policy (half the episodes split the task over
min(8, ceil(n/2)) sub-agents of <= 2 lookups, a quarter over 4, a quarter serial),
so both sides run exactly the same episodes, and the benchmark checks that they
produce identical outcomes. The model still runs every step on both sides.

* ``jit``: :class:`swarmjax.swarm.engine.SwarmRollout`: everything, environment
  included, in one ``lax.while_loop``, one token per agent per tick.
* ``host``: how torch-based agent frameworks drive multi-agent rollouts: a Python
  loop over decode rounds; the environment is Python (the reference protocol of
  :mod:`swarmjax.envs.widesearch`, as coroutines); each round calls a jitted
  decode step (orchestrator batch, then sub-agent batch) with KV caches kept on
  the device across turns, environment tokens prefilled in chunks, every running
  agent batched; the chosen tokens come back to the host each round.

Reported: episodes/s and decoded (sampled) tokens/s of each, the ratio, compile
time, and the engine's ticks.
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import matmul_peak_flops, time_best  # noqa: E402

from swarmjax.envs import scripts  # noqa: E402
from swarmjax.envs import widesearch_jax as wsj  # noqa: E402
from swarmjax.envs.widesearch import (Agent, Episode, Stage, Vocab, WideSearchConfig,  # noqa: E402
                                      episode_process)
from swarmjax.models.config import preset  # noqa: E402
from swarmjax.models.transformer import forward, init_cache, init_params, unstack_layers  # noqa: E402
from swarmjax.roles import Roles  # noqa: E402
from swarmjax.swarm.engine import RolloutConfig, Scripts, SwarmRollout  # noqa: E402
from swarmjax.swarm.outcome import text_result, to_outcomes  # noqa: E402


# ----------------------------------------------------------------------------- workload


def make_workload(cfg: WideSearchConfig, batch: int, seed: int = 0):
    """Episodes and per-agent scripts (orchestrator [B], workers [B][<= K])."""
    rng = random.Random(seed)
    eps, orch, workers = [], [], []
    for b in range(batch):
        ep = Episode.sample(cfg, rng)
        n, style = len(ep.task), b % 4
        parts = 1 if n == 1 or style == 3 else (4 if style == 2 else min(cfg.max_subagents, math.ceil(n / 2)))
        o, w = (scripts.serial(cfg, ep), []) if min(parts, n) == 1 else scripts.split(cfg, ep, min(parts, n))
        eps.append(ep)
        orch.append(o)
        workers.append(w)
    return eps, orch, workers


def to_scripts(orch, workers, K):
    lo = max(len(s) for s in orch)
    lw = max([len(s) for ws in workers for s in ws] + [1])
    o = np.full((len(orch), lo), -1, np.int32)
    w = np.full((len(orch), K, lw), -1, np.int32)
    for b, s in enumerate(orch):
        o[b, :len(s)] = s
        for k, ws in enumerate(workers[b]):
            w[b, k, :len(ws)] = ws
    return Scripts(orch=jnp.asarray(o), workers=jnp.asarray(w))


# ----------------------------------------------------------------------------- host baseline


class HostRollout:
    """Python-driven baseline (see the module docstring)."""

    def __init__(self, cfg: WideSearchConfig, model_cfg, batch: int, max_chunk: int = 64):
        self.cfg, self.mcfg, self.B, self.max_chunk = cfg, model_cfg, batch, max_chunk
        self.step = jax.jit(self._step, static_argnums=(0,), donate_argnums=(2,))

    @staticmethod
    def _step(mcfg, params, cache, tokens, mask, index):
        """Feed chunks [R, T] at per-row slots; greedy token after each row's last real one."""
        T = tokens.shape[1]
        pos = index[:, None] + jnp.arange(T)[None]
        out = forward(params, mcfg, tokens, positions=pos, token_mask=mask, cache=cache,
                      cache_index=index)
        last = jnp.maximum(jnp.sum(mask, axis=1) - 1, 0)
        logits = jnp.take_along_axis(out.logits, last[:, None, None], axis=1)[:, 0]
        return out.cache, jnp.argmax(logits, axis=-1)

    def _feed(self, params, cache, rows: dict[int, Agent], fed: np.ndarray, R: int):
        """Feed every requesting row's unfed context (in chunks of <= max_chunk)."""
        pending = {r: a.ctx[fed[r]:] for r, a in rows.items()}
        while pending:
            longest = max(len(c) for c in pending.values())
            T = min(self.max_chunk, 1 << (longest - 1).bit_length())
            tokens = np.zeros((R, T), np.int32)
            mask = np.zeros((R, T), bool)
            for r, chunk in pending.items():
                part = chunk[:T]
                tokens[r, :len(part)] = part
                mask[r, :len(part)] = True
            cache, _ = self.step(self.mcfg, params, cache, jnp.asarray(tokens), jnp.asarray(mask),
                                 jnp.asarray(fed))
            for r in list(pending):
                n = min(T, len(pending[r]))
                fed[r] += n
                pending[r] = pending[r][n:]
                if not pending[r]:
                    del pending[r]
        return cache

    def __call__(self, roles: Roles, eps, orch_scripts, worker_scripts):
        cfg, B, K = self.cfg, self.B, self.cfg.max_subagents
        params, worker_params = unstack_layers(roles.orchestrator), unstack_layers(roles.subagents)
        o_cache = init_cache(self.mcfg, B, cfg.contexts.orchestrator + self.max_chunk)
        w_cache = init_cache(self.mcfg, B * K, cfg.contexts.subagents + self.max_chunk)
        o_fed, w_fed = np.zeros(B, np.int32), np.zeros(B * K, np.int32)
        o_cur, w_cur = np.zeros(B, np.int64), np.zeros(B * K, np.int64)
        procs = [episode_process(cfg, ep) for ep in eps]
        outcomes: list = [None] * B
        o_req: dict[int, Agent] = {}           # orchestrator rows waiting for a token
        w_req: dict[int, Agent] = {}           # worker rows waiting for a token
        w_procs: dict[int, object] = {}
        stages: dict[int, list] = {}           # episode -> [worker rows, results]

        def handle_orch(b, msg):
            if isinstance(msg, Stage):
                rows = [b * K + a.slot for a in msg.agents]
                stages[b] = [rows, {}]
                for row, proc in zip(rows, msg.procs):
                    w_procs[row] = proc
                    advance_worker(row, None)
            else:
                o_req[b] = msg

        def advance_orch(b, reply):
            try:
                handle_orch(b, procs[b].send(reply))
            except StopIteration as stop:
                outcomes[b] = stop.value

        def advance_worker(row, reply):
            try:
                w_req[row] = w_procs[row].send(reply)
            except StopIteration as stop:
                b = row // K
                stages[b][1][row] = stop.value
                rows, results = stages[b]
                if len(results) == len(rows):
                    del stages[b]
                    advance_orch(b, [results[r] for r in rows])

        for b in range(B):
            advance_orch(b, None)
        rounds = 0
        while o_req or w_req:
            rounds += 1
            orch_now, work_now = dict(o_req), dict(w_req)
            o_req.clear()
            w_req.clear()
            if orch_now:
                o_cache = self._feed(params, o_cache, orch_now, o_fed, B)
            if work_now:
                w_cache = self._feed(worker_params, w_cache, work_now, w_fed, B * K)
            for b in orch_now:
                s = orch_scripts[b]
                tok = s[o_cur[b]] if o_cur[b] < len(s) else Vocab(cfg)["<eos>"]
                o_cur[b] += 1
                advance_orch(b, tok)
            for row in work_now:
                s = worker_scripts[row // K][row % K] if row % K < len(worker_scripts[row // K]) else []
                tok = s[w_cur[row]] if w_cur[row] < len(s) else Vocab(cfg)["<eos>"]
                w_cur[row] += 1
                advance_worker(row, tok)
        jax.block_until_ready(o_cache)
        return outcomes, rounds


# ----------------------------------------------------------------------------- main


def main(argv=None):
    import argparse

    argv = sys.argv[1:] if argv is None else argv
    if "--text" in argv:            # the text swarm: bench/rollout_text.py
        from rollout_text import main as text_main
        return text_main(argv)

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--size", default="1m")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    cfg = WideSearchConfig(budget=None)
    vocab = Vocab(cfg)
    mcfg = preset(args.size).replace(vocab_size=vocab.size)
    params = init_params(mcfg, jax.random.key(0))
    eps, orch, workers = make_workload(cfg, args.batch)
    scripts = to_scripts(orch, workers, cfg.max_subagents)
    tasks = wsj.Tasks(table=jnp.asarray([e.table for e in eps], jnp.int32),
                      entities=jnp.asarray([e.task + [-1] * (cfg.max_task_size - len(e.task)) for e in eps],
                                           jnp.int32),
                      n=jnp.asarray([len(e.task) for e in eps], jnp.int32))

    engine = SwarmRollout(RolloutConfig(env=cfg), mcfg)
    run_jit = lambda: jax.block_until_ready(engine(Roles.both(params), tasks, jax.random.key(0), scripts=scripts))
    t0 = time.perf_counter()
    result = run_jit()
    jit_first = time.perf_counter() - t0
    jit_s = time_best(run_jit, args.repeats)

    host = HostRollout(cfg, mcfg, args.batch)
    t0 = time.perf_counter()
    host_out, rounds = host(Roles.both(params), eps, orch, workers)
    host_first = time.perf_counter() - t0
    host_s = time_best(lambda: host(Roles.both(params), eps, orch, workers), args.repeats)

    jit_out = to_outcomes(cfg, text_result(cfg, result))
    same = all(a == b for a, b in zip(jit_out, host_out))
    if not same:
        raise SystemExit("the jitted engine and the host baseline disagree on an episode")
    sampled = int(np.sum(np.asarray(result.loss_mask)) + np.sum(np.asarray(result.worker_sampled)))
    figures = {
        "jax": jax.__version__, "backend": jax.default_backend(), "peak_flops": matmul_peak_flops(),
        "batch": args.batch, "size": args.size,
        "params": mcfg.num_params(), "jit_episodes_s": args.batch / jit_s, "host_episodes_s": args.batch / host_s,
        "ratio": host_s / jit_s, "jit_tok_s": sampled / jit_s, "host_tok_s": sampled / host_s,
        "jit_compile_s": jit_first - jit_s, "host_first_call_s": host_first, "jit_s": jit_s, "host_s": host_s,
        "ticks": int(result.ticks), "host_rounds": rounds, "sampled_tokens": sampled,
        "mean_critical_steps": float(np.mean(np.asarray(result.critical_steps))),
        "mean_subagents": float(np.mean(np.asarray(result.spawned))), "identical_episodes": same,
    }
    if args.json:
        print(json.dumps(figures))
        return
    print(f"jax {figures['jax']} on {figures['backend']} (float32 matmul peak {figures['peak_flops'] / 1e9:.1f} "
          f"GFLOP/s), {args.batch} episodes (n = 1..16), model {args.size} "
          f"({mcfg.num_params() / 1e6:.2f}M), {sampled} sampled tokens, mean critical steps "
          f"{figures['mean_critical_steps']:.1f}, mean sub-agents {figures['mean_subagents']:.1f}")
    print(f"{'':6}{'s/batch':>10}{'episodes/s':>12}{'tok/s':>10}{'first call s':>14}{'loop iters':>12}")
    print(f"{'jit':6}{jit_s:10.3f}{figures['jit_episodes_s']:12.1f}{figures['jit_tok_s']:10.0f}"
          f"{jit_first:14.2f}{figures['ticks']:12d}")
    print(f"{'host':6}{host_s:10.3f}{figures['host_episodes_s']:12.1f}{figures['host_tok_s']:10.0f}"
          f"{host_first:14.2f}{rounds:12d}")
    print(f"ratio jit/host episodes/s: {figures['ratio']:.2f}x (identical episodes: {same})")


if __name__ == "__main__":
    main()
