"""The token world through the environment API (:mod:`swarmjax.envs.widesearch_tokens`),
differential against the reference simulator.

1. A model-free host driver runs the environments exactly as ``TextRollout`` with
   ``max_turn_tokens=1`` does (one token per ``step``; a step counted at each ``Step``
   without ``more``): scripted policies (serial, splits, malformed turns, limits) and
   random scripts of every kind agree with :func:`simulate` on the same tokens.
2. ``TextRollout`` itself: the scripted episodes forced with ``TextScripts`` (a script
   turn is the whole turn's ids), and random-model episodes whose sampled tokens are
   replayed through :func:`simulate`. Both need ``Step.more`` in the rollout.

Agreement: orchestrator ids and sampled mask, steps, critical and total steps,
spawned, finished, end reason, answer, verifier rewards, and each sub-agent's ids,
steps and success; up to the differences at the context edge that the module
docstring names (a reply that does not fit leaves a tail of environment ids in the
reference only; an exactly full context with the budget spent is ``budget`` there).
"""

import dataclasses
import random

import jax
import numpy as np
import pytest

from swarmjax.envs import scripts
from swarmjax.envs.api import SubAgentResult
from swarmjax.envs.widesearch import PROTOCOL, Episode, Vocab, score, scripted, simulate
from swarmjax.envs.widesearch_tokens import STOP_IDS, WideSearchTokenEnv, parse_pairs, rollout_config
from swarmjax.models import init_params
from swarmjax.roles import Roles
from swarmjax.swarm.text_rollout import END_REASONS, TextRollout, TextScripts
from test_swarm import BIG, SMALL, model_for, random_batch   # BIG: default sizes (16 split 8 x 2)

EOS = PROTOCOL.index("<eos>")


@dataclasses.dataclass
class Run:
    """One episode in the reference's terms, as a host run or a text rollout saw it."""

    ids: list
    sampled: list
    orch_steps: int = 0
    critical_steps: int = 0
    total_steps: int = 0
    spawned: int = 0
    finished: int = 0
    end_reason: str | None = None
    answer: list | None = None
    rewards: dict = dataclasses.field(default_factory=dict)
    turns: list = dataclasses.field(default_factory=list)            # the orchestrator's turns' ids
    workers: list = dataclasses.field(default_factory=list)          # spawn order: (ids, sampled, steps, ok, turns)

    def add(self, rewards):
        for k, v in rewards.items():
            self.rewards[k] = self.rewards.get(k, 0.0) + v


def _run_worker(cfg, task, tokens):
    """A sub-agent as the rollout runs it: (ids, sampled, steps, ok, turns)."""
    env, feed = task.env, iter(tokens)
    ids = [int(t) for t in env.reset(task.task)]
    sampled, turns, turn, steps = [False] * len(ids), [], [], 0
    while True:
        tok = next(feed, EOS)
        ids.append(tok)
        sampled.append(True)
        turn.append(tok)
        step = env.step(np.asarray([tok], np.int32), truncated=True)
        if not step.more:
            steps += 1
            turns.append(turn)
            turn = []
            if step.done:
                return ids, sampled, steps, True, turns
            if steps >= cfg.subagent_steps:
                return ids, sampled, steps, False, turns
        if len(ids) + len(step.reply) + 1 > cfg.contexts.subagents:
            assert not step.more, "a reply mid-turn always leaves room for the next token"
            return ids, sampled, steps, False, turns
        ids += step.reply.tolist()
        sampled += [False] * len(step.reply)


def host_run(cfg, ep, orch, workers=()):
    """Run one episode's environments as ``TextRollout(rollout_config(cfg))`` runs them,
    model-free and serially: each agent says its next scripted token (then ``<eos>``)."""
    env, feed = WideSearchTokenEnv(cfg), iter(orch)
    prompt = [int(t) for t in env.reset(ep)]
    r, turn = Run(ids=prompt, sampled=[False] * len(prompt)), []
    while r.end_reason is None:
        if not turn and cfg.budget is not None and r.critical_steps + 1 > cfg.budget:
            r.end_reason = "budget"
            break
        tok = next(feed, EOS)
        r.ids.append(tok)
        r.sampled.append(True)
        turn.append(tok)
        step = env.step(np.asarray([tok], np.int32), truncated=True)
        r.add(step.rewards)
        if not step.more:
            r.orch_steps, r.critical_steps, r.total_steps = r.orch_steps + 1, r.critical_steps + 1, r.total_steps + 1
            r.turns.append(turn)
            turn = []
        if step.done:
            r.end_reason, r.answer = "answer", parse_pairs(Vocab(cfg), step.answer)
            break
        if step.spawn:
            subs = [_run_worker(cfg, t, workers[len(r.workers) + i] if len(r.workers) + i < len(workers) else [])
                    for i, t in enumerate(step.spawn)]
            r.workers += subs
            r.spawned, r.finished = r.spawned + len(subs), r.finished + sum(s[3] for s in subs)
            r.critical_steps += max(s[2] for s in subs)
            r.total_steps += sum(s[2] for s in subs)
            step = env.resume([SubAgentResult(agent=t.agent, answer=None, steps=s[2], ok=s[3], reason="")
                               for t, s in zip(step.spawn, subs)])
            r.add(step.rewards)
        if len(r.ids) + len(step.reply) + 1 > cfg.contexts.orchestrator:
            assert not step.more, "a reply mid-turn always leaves room for the next token"
            r.end_reason = "context"
            break
        r.ids += step.reply.tolist()
        r.sampled += [False] * len(step.reply)
    return r


def from_result(cfg, res, b):
    """Episode ``b`` of a :class:`TextRolloutResult` as a :class:`Run`."""
    o = res.orchestrators[b].arrays()
    answer = parse_pairs(Vocab(cfg), res.answers[b]) if res.answers[b] is not None else None
    workers = []
    for t in res.subagents[b]:
        a = t.arrays()
        workers.append((a["ids"].tolist(), a["sampled"].tolist(), t.steps, t.ok, None))
    turns = [o["ids"][o["sampled"] & (o["turn"] == i)].tolist() for i in range(1, int(res.orch_steps[b]) + 1)]
    return Run(ids=o["ids"].tolist(), sampled=o["sampled"].tolist(), orch_steps=int(res.orch_steps[b]),
               critical_steps=int(res.critical_steps[b]), total_steps=int(res.total_steps[b]),
               spawned=int(res.spawned[b]), finished=int(res.finished[b]),
               end_reason=END_REASONS[int(res.end_reason[b])], answer=answer,
               rewards={k: float(v[b]) for k, v in res.rewards.items()}, turns=turns, workers=workers)


def assert_same(cfg, ep, run, ref, where=""):
    """``run`` is the reference's ``ref`` (up to the documented context edge)."""
    msg = (where, Vocab(cfg).decode(ref.orch_tokens))
    n = len(run.ids)
    assert run.ids == ref.orch_tokens[:n] and run.sampled == ref.sampled[:n], msg
    assert not any(ref.sampled[n:]) and (run.end_reason == "context" or n == len(ref.orch_tokens)), msg
    if (run.end_reason, ref.end_reason) == ("context", "budget"):
        assert len(ref.orch_tokens) == cfg.contexts.orchestrator, msg            # full and out of budget
    else:
        assert run.end_reason == ref.end_reason, msg
    assert (run.orch_steps, run.critical_steps, run.total_steps, run.spawned, run.finished) == (
        ref.orch_steps, ref.critical_steps, ref.total_steps, ref.spawned, ref.finished), msg
    assert run.answer == ref.answer, msg
    # each turn's ids (a rollout's: by their stage id) start with the reference's kind of step
    assert [t for turn in run.turns for t in turn] == [t for t, s in zip(run.ids, run.sampled) if s], msg
    assert [Vocab(cfg).symbol(turn[0]) for turn in run.turns] == [st["kind"] for st in ref.stages], msg
    correct, answered, truth = score(ep, ref.answer)
    assert (run.rewards["correct"], run.rewards["answered"], run.rewards["truth"]) == (correct, answered, truth)
    results = [res for st in ref.stages for res in st["results"]]
    steps = [s for st in ref.stages for s in st["worker_steps"]]
    assert len(run.workers) == len(ref.worker_tokens), msg
    for k, (ids, sampled, n_steps, ok, _) in enumerate(run.workers):
        want, said = ref.worker_tokens[k], ref.worker_sampled[k]
        assert ids == want[:len(ids)] and sampled == said[:len(ids)] and not any(said[len(ids):]), (k, msg)
        assert (n_steps, ok) == (steps[k], results[k] is not None), (k, msg)


def scripted_episodes(cfg):
    """Serial (over budget), splits 8 x 2, 4 x 4, 2 x 8, 16 x 1 (K = 8: the environment
    says the <wait>), a worker out of steps, malformed spawns, an answer before <wait>."""
    v, rng = Vocab(cfg), random.Random(0)
    eps = [Episode.sample(cfg, rng, n=16) for _ in range(8)]
    plans = [(scripts.serial(cfg, eps[0]), [])]
    for ep, parts in zip(eps[1:5], (8, 4, 2, 16)):
        o, _ = scripts.split(cfg, ep, parts)
        plans.append((o, [scripts.worker(cfg, ep, c) for c in scripts.chunks(ep.task, parts)[:8]]))
    ep = eps[5]
    plans.append((v.encode(f"<spawn> e{ep.task[0]} </spawn> <spawn> e{ep.task[1]} </spawn> <wait> <answer> </answer>"),
                  [[v["<lookup>"], v.entity(ep.task[0])] * 6, scripts.worker(cfg, ep, ep.task[1:2])]))
    ep = eps[6]
    plans.append((v.encode(f"<spawn> </spawn> <spawn> v1 <spawn> e{ep.task[0]} </spawn> <lookup> <lookup> "
                           f"e{ep.task[0]} <answer> e{ep.task[0]} v{ep.table[ep.task[0]]} </answer>"), []))
    plans.append((v.encode(f"<spawn> e{eps[7].task[0]} </spawn> <answer> </answer>"), []))
    return eps, plans


def reference(cfg, ep, orch, workers):
    return simulate(cfg, ep, scripted(orch), scripted([]), workers=[scripted(w) for w in workers]
                    + [scripted([])] * cfg.max_subagents)


def test_scripted_policies_through_a_host_driver():
    eps, plans = scripted_episodes(BIG)
    for b, (ep, (orch, workers)) in enumerate(zip(eps, plans)):
        run = host_run(BIG, ep, orch, workers)
        ref = reference(BIG, ep, orch, workers)
        assert_same(BIG, ep, run, ref, b)
    runs = [host_run(BIG, ep, *plan) for ep, plan in zip(eps, plans)]
    assert [r.end_reason for r in runs[:5]] == ["budget", "answer", "answer", "answer", "budget"]
    assert [r.critical_steps for r in runs[1:4]] == [5, 7, 7]
    assert runs[1].rewards == {"r_perf": 1.0, "correct": 16, "answered": 16, "truth": 16, "novel": 8,
                               "returned": 16}
    assert [len(t) for t in runs[1].turns] == [8 * 4, 1 + 32 + 1]       # 8 blocks (no <wait>: K = 8), answer
    assert [len(t) for t in runs[1].workers[0][4]] == [2, 2, 6]         # lookup, lookup, return


@pytest.mark.parametrize("cfg,seed", [(SMALL, 1), (SMALL, 2), (BIG, 3)])
def test_random_scripts_through_a_host_driver(cfg, seed):
    """Turns of every kind, valid and not, on configs whose limits random play hits."""
    eps, orch, workers = random_batch(cfg, seed, 150)
    refs = [reference(cfg, ep, o, w) for ep, o, w in zip(eps, orch, workers)]
    for b, (ep, o, w, ref) in enumerate(zip(eps, orch, workers, refs)):
        assert_same(cfg, ep, host_run(cfg, ep, o, w), ref, b)
    if cfg is SMALL:
        assert {r.end_reason for r in refs} == {"answer", "budget", "context"}
        assert any(r.finished < r.spawned for r in refs)


# ----------------------------------------------------------------------------- the text rollout


@pytest.fixture(scope="module")
def rollouts():
    out = {}
    for name, cfg in (("big", BIG), ("small", SMALL)):
        mcfg = model_for(cfg)
        params = jax.tree.map(lambda x: x * 6 if x.ndim >= 2 else x, init_params(mcfg, jax.random.key(1)))
        engine = TextRollout(mcfg, rollout_config(cfg, subagent_lanes=4, prefill_buckets=(16, 64)),
                             stop_ids=STOP_IDS)
        out[name] = (cfg, engine, params)
    yield out
    for _, engine, _ in out.values():
        engine.close()


@pytest.mark.slow
def test_scripted_policies_through_the_text_rollout(rollouts):
    """The scripted episodes forced turn by turn (each script turn the ids of one whole
    turn, as the host run split them)."""
    cfg, engine, params = rollouts["big"]
    eps, plans = scripted_episodes(cfg)
    runs = [host_run(cfg, ep, *plan) for ep, plan in zip(eps, plans)]
    forced = TextScripts(orch=[r.turns for r in runs], workers=[[w[4] for w in r.workers] for r in runs])
    res = engine(Roles.both(params), [WideSearchTokenEnv(cfg) for _ in eps], eps, jax.random.key(0), scripts=forced)
    for b, (ep, (orch, workers)) in enumerate(zip(eps, plans)):
        assert_same(cfg, ep, from_result(cfg, res, b), reference(cfg, ep, orch, workers), b)
    assert res.rewards["r_perf"][1] == 1.0 and res.rewards["novel"][1] == 8


def spawn_turn(cfg, ep, rng):
    """A random well-formed spawn turn: 1..K blocks of 1..2 asked-for entities."""
    v, parts = Vocab(cfg), rng.randint(1, cfg.max_subagents)
    toks = [t for _ in range(parts) for t in (v["<spawn>"], *(v.entity(e) for e in rng.sample(
        ep.task, rng.randint(1, min(2, len(ep.task))))), v["</spawn>"])]
    return toks + ([v["<wait>"]] if parts < cfg.max_subagents else [])


@pytest.mark.slow
@pytest.mark.parametrize("which,sizes", [("small", [1, 2, 3, 4] * 3), ("big", [16, 16, 8, 1])])
def test_random_model_episodes_replay_exactly(rollouts, which, sizes):
    """A random model samples at temperature 1 (every other episode after a forced first
    turn that spawns random blocks, so sampling sub-agents run too); the tokens its
    agents said, replayed through the reference, give the same episodes."""
    cfg, engine, params = rollouts[which]
    rng = random.Random(7)
    eps = [Episode.sample(cfg, rng, n=n) for n in sizes]
    first = TextScripts(orch=[[spawn_turn(cfg, ep, rng)] if b % 2 else [] for b, ep in enumerate(eps)])
    res = engine(Roles.both(params), [WideSearchTokenEnv(cfg) for _ in eps], eps, jax.random.key(4), scripts=first)
    for b, ep in enumerate(eps):
        run = from_result(cfg, res, b)
        orch = [t for t, s in zip(run.ids, run.sampled) if s]
        workers = [[t for t, s in zip(w[0], w[1]) if s] for w in run.workers]
        assert_same(cfg, ep, run, reference(cfg, ep, orch, workers), b)
    assert int(res.orch_steps[::2].sum()) > len(eps)         # the random policy did act
    assert int(res.spawned.sum()) > 0 and sum(t.steps for s in res.subagents for t in s) > int(res.spawned.sum())
