"""Fuzzing the jitted swarm engine against the reference simulator, at scale.

    python bench/fuzz.py                         # 10^5 episodes; exits 1 on any failure
    python bench/fuzz.py --episodes 1000 --json

Every batch runs B random episodes of one task size and one policy through the
jitted rollout (:class:`swarmjax.swarm.engine.SwarmRollout`, with
``check_indices``), then drives the pure-Python reference simulator
(:func:`swarmjax.envs.widesearch.simulate`) with the same tokens, episode by
episode. Batches cycle over every (size, policy) pair.

Sizes (:data:`SIZES`): four task configurations from a tiny one where random play
hits every limit (context, steps, spawns, budget) to the defaults with the budget
lifted (the largest: n up to 16, K = 8, contexts 256 / 48), each with fewer
sub-agent KV-cache lanes than slots, so the sub-agents of spawning policies queue
for lanes. The models are random (:func:`random_model`, untied head) with a few ids
beyond the task's vocabulary.

Policies (:data:`POLICIES`):

* ``model-t1``, ``model-t2``: the random model samples every token (the
  production path, no scripts) at temperature 1 and 2;
* ``model-t8``: the same at temperature 8, close to uniform random tokens;
* ``tokens``: forced uniform random ids over the model's vocabulary;
* ``grammar``: forced random turns of every kind, valid and malformed
  (lookups, spawn blocks, answers, returns, stray tokens);
* ``spawn-t1``, ``spawn-t2``: a forced random spawn turn of 1..K sub-agents,
  then the random model samples everything (its sub-agents too); random models
  never spawn on their own.

A temperature is applied as a 1/T scale of the output head (the same sampling
distribution), so every temperature of a size shares one compiled engine.

Failures, each counted in episodes and by kind (all must be 0):

* crashes: an exception in the engine (the batch's episodes) or in the host checks;
* out of bounds: the engine's in-loop index checks (lane ids, write positions,
  cache slots, sub-agent / answer / result / return / tool-reply slots, entity ids:
  :data:`swarmjax.swarm.engine.INDEX_CHECKS`) and range checks on the returned
  arrays (:func:`array_errors`);
* differences: any field of the engine's episode that the reference's differs
  in (every token, loss mask, steps, answer, sub-agent contexts), the verifier's
  counts, and the reward's sub-agent counts (novel, returned, parallel);
* cut by max_ticks: episodes the loop stopped before they ended.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import sys
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from swarmjax.envs import scripts as scripts_lib
from swarmjax.envs import widesearch_jax as wsj
from swarmjax.envs.widesearch import PROTOCOL, Episode, Outcome, Vocab, WideSearchConfig, score, scripted, simulate
from swarmjax.models import ModelConfig, init_params
from swarmjax.roles import Roles
from swarmjax.swarm.engine import INDEX_CHECKS, SAMPLE, RolloutConfig, RolloutResult, Scripts, SwarmRollout
from swarmjax.swarm.outcome import (episodes, novel_subagents, parallel_entities, returned_entities, text_result,
                                    to_outcomes)

EOS, PAD = PROTOCOL.index("<eos>"), PROTOCOL.index("<pad>")
EXTRA_IDS = 4          # model vocabulary beyond the task's: ids no protocol rule knows


@dataclasses.dataclass(frozen=True)
class Size:
    """A task configuration and its sub-agent KV-cache lanes (fewer than the B x K slots
    of a batch, so sub-agents wait for lanes)."""

    env: WideSearchConfig
    subagent_lanes: int


SIZES: dict[str, Size] = {
    "tiny": Size(WideSearchConfig(num_entities=4, num_values=3, min_task_size=1, max_task_size=2,
                                  max_subagents=2, subagent_steps=2, budget=5, contexts=Roles(14, 7)),
                  subagent_lanes=40),
    "small": Size(WideSearchConfig(num_entities=8, num_values=6, min_task_size=1, max_task_size=4,
                                   max_subagents=3, subagent_steps=3, budget=12, contexts=Roles(40, 14)),
                   subagent_lanes=24),
    "medium": Size(WideSearchConfig(num_entities=24, num_values=12, min_task_size=1, max_task_size=8,
                                    max_subagents=4, subagent_steps=4, budget=None, contexts=Roles(96, 24)),
                    subagent_lanes=20),
    "largest": Size(WideSearchConfig(budget=None), subagent_lanes=64),
}

# name -> (scripted, temperature); see the module docstring
POLICIES: dict[str, tuple[bool, float]] = {
    "model-t1": (False, 1.0), "model-t2": (False, 2.0), "model-t8": (False, 8.0),
    "tokens": (True, 1.0), "grammar": (True, 1.0), "spawn-t1": (True, 1.0), "spawn-t2": (True, 2.0),
}


def model_config(env: WideSearchConfig) -> ModelConfig:
    """A one-layer untied model over the task vocabulary plus :data:`EXTRA_IDS` ids (the
    reference has no model: only the tokens it samples matter here, and one layer
    compiles a third faster than two)."""
    return ModelConfig(vocab_size=Vocab(env).size + EXTRA_IDS, hidden_size=32, num_layers=1, num_heads=4,
                       num_kv_heads=2, head_dim=8, intermediate_size=64, tie_embeddings=False)


def random_model(mcfg: ModelConfig, seed: int, *, scale: float = 6.0, head: float = 4.0) -> dict:
    """Random weights, every matrix scaled by ``scale`` and the output head by
    ``head`` more: logits of std ~3, so at temperature 1 the model prefers some ids
    per context, at 8 it is close to uniform (random-init logits have std ~0.1)."""
    params = jax.tree.map(lambda x: x * scale if x.ndim >= 2 else x, init_params(mcfg, jax.random.key(seed)))
    return {**params, "lm_head": params["lm_head"] * head}


def at_temperature(params: dict, temperature: float) -> dict:
    """The model whose temperature-1 sampling is ``params``' at ``temperature``:
    logits = h @ (lm_head / T) = (h @ lm_head) / T (untied head)."""
    return {**params, "lm_head": params["lm_head"] / temperature}


# ----------------------------------------------------------------------------- policies


def uniform_tokens(env: WideSearchConfig, vocab_size: int, rng: np.random.Generator, batch: int) -> Scripts:
    """Forced uniform random ids in [0, vocab_size): orch [B, C], workers [B, K, W]."""
    K, C, W = env.max_subagents, env.contexts.orchestrator, env.contexts.subagents
    return Scripts(orch=rng.integers(0, vocab_size, (batch, C), dtype=np.int32),
                   workers=rng.integers(0, vocab_size, (batch, K, W), dtype=np.int32))


def grammar_orchestrator(env: WideSearchConfig, ep: Episode, rng: np.random.Generator, *,
                         stray_ids: int = EXTRA_IDS) -> list[int]:
    """Up to 6 random turns (lookup, spawn stage, stray token), valid and malformed,
    then (usually) an answer, possibly wrong or cut short. Stray tokens are drawn from
    the task's vocabulary plus ``stray_ids`` ids beyond it."""
    v = Vocab(env)
    ent = lambda: v.entity(int(rng.choice(ep.task)) if rng.random() < 0.8 else int(rng.integers(env.num_entities)))
    toks: list[int] = []
    for _ in range(rng.integers(0, 7)):
        kind = rng.random()
        if kind < 0.3:
            toks += [v["<lookup>"], ent() if rng.random() < 0.8 else v.value(0)]
        elif kind < 0.75:
            for _ in range(rng.integers(1, env.max_subagents + 2)):
                toks += [v["<spawn>"], *(ent() for _ in range(rng.choice([0, 1, 1, 2, 3]))), v["</spawn>"]]
            toks.append(v["<wait>"] if rng.random() < 0.85 else v["<answer>"])
        else:
            toks.append(int(rng.integers(v.size + stray_ids)))
    if rng.random() < 0.85:
        toks.append(v["<answer>"])
        for e in ep.task:
            if rng.random() < 0.8:
                value = ep.table[e] if rng.random() < 0.8 else int(rng.integers(env.num_values))
                toks += [v.entity(e), v.value(value)]
        toks.append(v["</answer>"] if rng.random() < 0.8 else v["<lookup>"])
    return toks


def grammar_worker(env: WideSearchConfig, ep: Episode, rng: np.random.Generator, *,
                   stray_ids: int = EXTRA_IDS) -> list[int]:
    """A valid sub-agent (lookups then a return of 1..3 entities) or random ids (the
    task's vocabulary plus ``stray_ids``)."""
    if rng.random() < 0.5:
        ents = [int(e) for e in rng.choice(env.num_entities, int(rng.integers(1, 4)), replace=False)]
        return scripts_lib.worker(env, ep, ents)
    return [int(t) for t in rng.integers(0, Vocab(env).size + stray_ids, rng.integers(0, 13))]


def spawn_prefix(env: WideSearchConfig, ep: Episode, rng: np.random.Generator) -> list[int]:
    """A valid spawn turn of 1..K blocks of 1..3 task entities (``<wait>`` unless the
    K-th block, after which the environment says it)."""
    v = Vocab(env)
    blocks = int(rng.integers(1, env.max_subagents + 1))
    toks: list[int] = []
    for _ in range(blocks):
        n = int(rng.integers(1, min(3, len(ep.task), env.max_block_entities) + 1))
        toks += [v["<spawn>"], *(v.entity(int(e)) for e in rng.choice(ep.task, n, replace=False)), v["</spawn>"]]
    return toks + ([v["<wait>"]] if blocks < env.max_subagents else [])


def pad_rows(rows: list[list[int]], width: int, fill: int) -> np.ndarray:
    """Rows of ids [R, width], each cut at ``width`` and padded with ``fill``."""
    out = np.full((len(rows), width), fill, np.int32)
    for i, r in enumerate(rows):
        out[i, :min(len(r), width)] = r[:width]
    return out


def policy_scripts(policy: str, env: WideSearchConfig, vocab_size: int, eps: list[Episode],
                   rng: np.random.Generator) -> Scripts | None:
    """The forced tokens of a scripted policy, orch [B, C] and workers [B, K, W]
    (``-1``: say ``<eos>``; :data:`SAMPLE`: the model samples); None for the model."""
    K, C, W, B = env.max_subagents, env.contexts.orchestrator, env.contexts.subagents, len(eps)
    if not POLICIES[policy][0]:
        return None
    if policy == "tokens":
        return uniform_tokens(env, vocab_size, rng, B)
    if policy == "grammar":
        orch = pad_rows([grammar_orchestrator(env, ep, rng) for ep in eps], C, -1)
        workers = [pad_rows([grammar_worker(env, ep, rng) for _ in range(K)], W, -1) for ep in eps]
        return Scripts(orch=orch, workers=np.stack(workers))
    orch = pad_rows([spawn_prefix(env, ep, rng) for ep in eps], C, SAMPLE)
    return Scripts(orch=orch, workers=np.full((B, K, W), SAMPLE, np.int32))


# ----------------------------------------------------------------------------- reference side


def agent_tokens(script: np.ndarray | None, sampled: list[int]) -> list[int]:
    """The tokens that drove one agent, in order: entry i of its script [Ls] (``-1``:
    ``<eos>``; :data:`SAMPLE`: the i-th token the engine sampled for it), or without
    a script the engine's sampled tokens. Entries past the last non-pad are dropped
    (the reference then says ``<eos>``, as the engine does)."""
    if script is None:
        return list(sampled)
    used = np.nonzero(script != -1)[0]
    out = []
    for i, entry in enumerate(script[:used[-1] + 1] if len(used) else []):
        if entry == SAMPLE:
            if i >= len(sampled):
                break
            out.append(sampled[i])
        else:
            out.append(int(entry) if entry >= 0 else EOS)
    return out


def reference(env: WideSearchConfig, ep: Episode, got: Outcome, script: Scripts | None, b: int) -> Outcome:
    """The reference simulator's episode b, driven by its scripts (SAMPLE entries and
    unscripted agents by what the engine sampled, read from its outcome ``got``)."""
    K = env.max_subagents
    orch = agent_tokens(None if script is None else script.orch[b],
                        [t for t, s in zip(got.orch_tokens, got.sampled) if s])
    said = [[t for t, s in zip(got.worker_tokens[k], got.worker_sampled[k]) if s] if k < len(got.worker_tokens)
            else [] for k in range(K)]
    workers = [agent_tokens(None if script is None else script.workers[b, k], said[k]) for k in range(K)]
    return simulate(env, ep, scripted(orch), scripted([]), workers=[scripted(w) for w in workers])


def novel_ref(ep: Episode, out: Outcome) -> int:
    """Sub-agents whose block brings an asked-for entity no earlier block had (host)."""
    seen, count, base = set(), 0, len(PROTOCOL)
    for toks in out.worker_tokens:
        block = [t - base for t in toks[2:toks.index(PROTOCOL.index("</task>"))]]
        count += any(e in ep.task and e not in seen for e in block)
        seen |= set(block)
    return count


def parallel_ref(ep: Episode, out: Outcome) -> int:
    """Asked-for entities returned beside each stage's busiest sub-agent (host); an
    entity counts for the first sub-agent (spawn order) that returned it."""
    seen, total = set(), 0
    for st in out.stages:
        own = []
        for r in st["results"]:
            got = {e for e, _ in (r or []) if e in ep.task and e not in seen}
            seen |= got
            own.append(len(got))
        total += sum(own) - max(own, default=0)
    return total


def returned_ref(ep: Episode, out: Outcome) -> int:
    """Distinct asked-for entities that finished sub-agents returned (host)."""
    return len({e for st in out.stages for r in st["results"] if r for e, _ in r if e in ep.task})


def episode_differences(ep: Episode, got: Outcome, want: Outcome, counts: dict[str, int]) -> list[str]:
    """Names of what differs between the engine's episode and the reference's: fields
    of :class:`Outcome`, ``verifier`` ((correct, answered, truth) vs :func:`score`),
    and the reward's counts ``novel`` / ``returned`` / ``parallel`` vs the host's."""
    diffs = [f.name for f in dataclasses.fields(want) if getattr(got, f.name) != getattr(want, f.name)]
    if (counts["correct"], counts["answered"], counts["truth"]) != score(ep, want.answer):
        diffs.append("verifier")
    for name, ref in (("novel", novel_ref), ("returned", returned_ref), ("parallel", parallel_ref)):
        if counts[name] != ref(ep, want):
            diffs.append(name)
    return diffs


def array_errors(env: WideSearchConfig, vocab_size: int, r: RolloutResult) -> dict[str, np.ndarray]:
    """Range checks on the returned arrays (host numpy), per kind an episode mask [B]:

    * ``length``: n + 3 <= length <= C, 0 <= worker_length <= W, unspawned slots empty;
    * ``token_id``: context tokens in [0, vocab) up to each length, ``<pad>`` after;
    * ``answer_id``: answer_len <= C // 2, answered entities in [0, E), values in [0, V);
    * ``return_id``: worker_return_len even in [0, W], returned ``e v`` ids of their kinds;
    * ``stage_id``: stage ids in [0, orch_steps], spawned slots' stages in [1, orch_steps];
    * ``count``: spawned <= K, finished <= spawned, correct <= answered <= answer_len.
    """
    vocab = Vocab(env)
    K, C, W, E = env.max_subagents, env.contexts.orchestrator, env.contexts.subagents, env.num_entities
    r = jax.tree.map(np.asarray, jax.device_get(r))
    within = lambda x, lo, hi: (x >= lo) & (x < hi)
    rows = lambda m: m.reshape(m.shape[0], -1).any(-1)
    spawned = np.arange(K)[None] < r.spawned[:, None]                                     # [B, K]
    ctx = np.arange(C)[None] < r.length[:, None]                                          # [B, C]
    wctx = np.arange(W)[None, None] < r.worker_length[..., None]                          # [B, K, W]
    tok_bad = lambda t, live: np.where(live, ~within(t, 0, vocab_size), t != PAD)
    pairs = np.arange(r.answer.shape[1])[None] < r.answer_len[:, None]                    # [B, A]
    j = np.arange(W)[None, None]
    ret_live = (j < r.worker_return_len[..., None]) & spawned[..., None]                  # [B, K, W]
    ret_kind = np.where(j % 2 == 0, within(r.worker_return, vocab.entity_base, vocab.value_base),
                        within(r.worker_return, vocab.value_base, vocab.size))
    steps = r.orch_steps[:, None]
    return {
        "length": (~within(r.length, r.truth + 3, C + 1)) | rows(~within(r.worker_length, 0, W + 1))
                  | rows(~spawned & (r.worker_length != 0)),
        "token_id": rows(tok_bad(r.tokens, ctx)) | rows(tok_bad(r.worker_tokens, wctx)),
        "answer_id": ~within(r.answer_len, 0, C // 2 + 1)
                     | rows(pairs & ~(within(r.answer[..., 0], 0, E) & within(r.answer[..., 1], 0, env.num_values))),
        "return_id": rows(~within(r.worker_return_len, 0, W + 1) | (r.worker_return_len % 2 == 1))
                     | rows(ret_live & ~ret_kind),
        "stage_id": rows(ctx & ~within(r.stage_ids, 0, steps + 1))
                    | rows(spawned & ~within(r.worker_stage, 1, steps + 1)),
        "count": ~within(r.spawned, 0, K + 1) | ~within(r.finished, 0, r.spawned + 1)
                 | (r.correct > r.answered) | (r.answered > r.answer_len),
    }


# ----------------------------------------------------------------------------- the run


@dataclasses.dataclass
class Report:
    """What a fuzz run found. The four failure counts are episodes (plus one difference
    per batch whose ``cut_by_max_ticks`` disagrees with its running episodes); ``kinds``
    counts each failure kind (an episode may have several), ``coverage`` what the
    episodes did."""

    episodes: int = 0
    crashes: int = 0
    out_of_bounds: int = 0
    differences: int = 0
    cut_by_max_ticks: int = 0
    kinds: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    coverage: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    examples: list[str] = dataclasses.field(default_factory=list)
    seconds: float = 0.0
    warm_episodes: int = 0       # episodes of batches whose engine was already compiled
    warm_seconds: float = 0.0

    @property
    def failures(self) -> int:
        return self.crashes + self.out_of_bounds + self.differences + self.cut_by_max_ticks

    def note(self, kind: str, where: str, count: int = 1, *, keep: int = 10) -> None:
        self.kinds[kind] += count
        if len(self.examples) < keep:
            self.examples.append(f"{kind}: {where}")


@dataclasses.dataclass
class Target:
    """One size's engine (``check_indices`` on) and random model."""

    name: str
    size: Size
    engine: SwarmRollout
    params: dict


def make_targets(sizes: list[str], *, seed: int = 0) -> list[Target]:
    out = []
    for i, name in enumerate(sizes):
        size = SIZES[name]
        mcfg = model_config(size.env)
        rcfg = RolloutConfig(env=size.env, subagent_lanes=size.subagent_lanes, check_indices=True)
        out.append(Target(name, size, SwarmRollout(rcfg, mcfg), random_model(mcfg, seed + i)))
    return out


_COUNTS = {"novel": jax.jit(novel_subagents), "returned": jax.jit(returned_entities),
           "parallel": jax.jit(parallel_entities)}


def check_batch(target: Target, eps: list[Episode], script: Scripts | None, result: RolloutResult,
                report: Report, where: str, *, count: int) -> None:
    """Check the first ``count`` episodes of a finished batch (tasks ``eps``, driven by
    ``script``, None for the model alone) into ``report``."""
    env, vocab_size = target.size.env, target.engine.cfgs.orchestrator.vocab_size
    counts = {k: np.asarray(f(result)) for k, f in _COUNTS.items()}
    counts.update(correct=np.asarray(result.correct), answered=np.asarray(result.answered),
                  truth=np.asarray(result.truth))
    oob = array_errors(env, vocab_size, result)
    loop = np.asarray(result.index_errors)                                       # [B, checks]
    running = np.asarray(result.end_reason) == wsj.RUNNING
    outs = to_outcomes(env, text_result(env, result))
    if int(result.cut_by_max_ticks) != int(np.sum(running)):
        report.note("difference:cut_by_max_ticks_count", where)
        report.differences += 1
    for b in range(count):
        at = f"{where} episode {b}"
        kinds = [k for k, m in oob.items() if m[b]] + [f"loop:{c}" for c, n in zip(INDEX_CHECKS, loop[b]) if n]
        for k in kinds:
            report.note(f"out_of_bounds:{k}", at)
        report.out_of_bounds += bool(kinds)
        if running[b]:
            report.note("cut_by_max_ticks", at)
            report.cut_by_max_ticks += 1
        try:
            want = reference(env, eps[b], outs[b], script, b)
            diffs = episode_differences(eps[b], outs[b], want, {k: int(v[b]) for k, v in counts.items()})
        except Exception as e:  # noqa: BLE001 -- a crash is a finding, counted and reported
            report.note("crash:host", f"{at}: {type(e).__name__}: {e}")
            report.crashes += 1
            continue
        for d in diffs:
            report.note(f"difference:{d}", at)
        report.differences += bool(diffs)
        got = outs[b]
        report.coverage[f"end:{got.end_reason}"] += 1
        report.coverage["subagents"] += got.spawned
        report.coverage["subagents_returned"] += got.finished
        report.coverage["episodes_spawning"] += got.spawned > 0
        report.coverage["sampled_tokens"] += sum(got.sampled) + sum(map(sum, got.worker_sampled))


def rollout_batch(target: Target, policy: str, batch: int, seed: int
                  ) -> tuple[list[Episode], Scripts | None, RolloutResult]:
    """``batch`` fresh tasks (from ``seed``), the policy's scripts (host arrays) and
    the jitted rollout of them, finished."""
    env = target.size.env
    tasks = wsj.reset(jax.random.key(seed), env, batch)
    eps = episodes(tasks)
    script = policy_scripts(policy, env, target.engine.cfgs.orchestrator.vocab_size, eps, np.random.default_rng(seed))
    params = at_temperature(target.params, POLICIES[policy][1])
    result = target.engine(Roles.both(params), tasks, jax.random.key(seed + 1),
                           scripts=None if script is None else jax.tree.map(jnp.asarray, script))
    return eps, script, jax.block_until_ready(result)


def run_batch(target: Target, policy: str, batch: int, seed: int, report: Report, *, count: int) -> None:
    """One batch of ``batch`` episodes, the first ``count`` checked into ``report``."""
    where = f"size {target.name} policy {policy} seed {seed}"
    try:
        eps, script, result = rollout_batch(target, policy, batch, seed)
    except Exception as e:  # noqa: BLE001 -- a crash is a finding, counted and reported
        report.note("crash:rollout", f"{where}: {type(e).__name__}: {e}", count)
        report.crashes += count
        return
    try:
        check_batch(target, eps, script, result, report, where, count=count)
    except Exception as e:  # noqa: BLE001 -- e.g. a result the host cannot even read
        report.note("crash:check", f"{where}: {type(e).__name__}: {e}", count)
        report.crashes += count
        return
    report.coverage[f"size:{target.name}"] += count
    report.coverage[f"policy:{policy}"] += count
    report.coverage["ticks"] += int(result.ticks)


def fuzz(episodes_total: int, *, batch: int = 256, sizes: list[str] | None = None,
         policies: list[str] | None = None, seed: int = 0,
         progress: Callable[[Report, float], None] | None = None) -> Report:
    """Run ``episodes_total`` episodes in batches of ``batch``, batch i on the i-th
    (size, policy) pair in turn; returns the :class:`Report`. ``progress(report,
    elapsed_s)`` is called after every batch."""
    targets = make_targets(sizes or list(SIZES), seed=seed)
    pairs = [(t, p) for t in targets for p in (policies or list(POLICIES))]
    report = Report()
    compiled: set[tuple[str, bool]] = set()
    t0 = time.perf_counter()
    i = 0
    while report.episodes < episodes_total:
        target, policy = pairs[i % len(pairs)]
        count = min(batch, episodes_total - report.episodes)
        t1 = time.perf_counter()
        run_batch(target, policy, batch, seed * 1_000_003 + i, report, count=count)
        if (target.name, POLICIES[policy][0]) in compiled:
            report.warm_episodes += count
            report.warm_seconds += time.perf_counter() - t1
        compiled.add((target.name, POLICIES[policy][0]))
        report.episodes += count
        report.seconds = time.perf_counter() - t0
        if progress is not None:
            progress(report, report.seconds)
        i += 1
    return report


# ----------------------------------------------------------------------------- main


def print_progress(every_s: float = 10.0) -> Callable[[Report, float], None]:
    """A progress callback that writes one line to stderr at most every ``every_s``."""
    last = [-every_s]

    def show(report: Report, elapsed: float) -> None:
        if elapsed - last[0] >= every_s:
            last[0] = elapsed
            print(f"  {report.episodes:>8,} episodes  {elapsed:7.0f} s  {report.episodes / elapsed:7.1f} ep/s  "
                  f"failures {report.failures}", file=sys.stderr, flush=True)
    return show


def summary(report: Report, sizes: list[str], batch: int) -> dict:
    return {
        "episodes": report.episodes, "batch": batch, "seconds": report.seconds,
        "episodes_s": report.episodes / max(report.seconds, 1e-9),
        "compiled_episodes_s": report.warm_episodes / max(report.warm_seconds, 1e-9),
        "sizes": {n: {**dataclasses.asdict(SIZES[n].env), "subagent_lanes": SIZES[n].subagent_lanes} for n in sizes},
        "policies": list(POLICIES), "crashes": report.crashes, "out_of_bounds": report.out_of_bounds,
        "differences": report.differences, "cut_by_max_ticks": report.cut_by_max_ticks,
        "failure_kinds": dict(report.kinds), "coverage": dict(report.coverage), "examples": report.examples,
        "jax": jax.__version__, "backend": jax.default_backend(),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--episodes", type=int, default=100_000)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    report = fuzz(args.episodes, batch=args.batch, sizes=args.sizes, seed=args.seed, progress=print_progress())
    s = summary(report, args.sizes, args.batch)
    if args.json:
        print(json.dumps(s))
    else:
        print(f"jax {s['jax']} on {s['backend']}: {s['episodes']:,} episodes in {s['seconds']:.0f} s "
              f"({s['episodes_s']:.1f} episodes/s; {s['compiled_episodes_s']:.1f} once compiled), "
              f"batches of {args.batch}")
        for n in args.sizes:
            e = SIZES[n].env
            print(f"  size {n:8} E={e.num_entities} V={e.num_values} n={e.min_task_size}..{e.max_task_size} "
                  f"K={e.max_subagents} S_sub={e.subagent_steps} budget={e.budget} C={e.contexts.orchestrator} "
                  f"W={e.contexts.subagents} lanes={SIZES[n].subagent_lanes} a shard: "
                  f"{report.coverage[f'size:{n}']:,} episodes")
        print(f"  policies {', '.join(POLICIES)}")
        cov = report.coverage
        ends = ", ".join(f"{r} {cov[f'end:{r}']:,}" for r in ("answer", "budget", "context"))
        print(f"  endings: {ends}; sub-agents {cov['subagents']:,} ({cov['subagents_returned']:,} returned) in "
              f"{cov['episodes_spawning']:,} episodes; {cov['sampled_tokens']:,} agent tokens; "
              f"{cov['ticks']:,} loop ticks")
        print(f"crashes {report.crashes}   out-of-bounds {report.out_of_bounds}   differences {report.differences}"
              f"   cut by max_ticks {report.cut_by_max_ticks}")
        for kind, n in sorted(report.kinds.items()):
            print(f"  {kind}: {n}")
        for ex in report.examples:
            print(f"  e.g. {ex}")
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
