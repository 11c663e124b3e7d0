"""The PARL shaping of the default config over its whole schedule (issue 15).

Each strategy below is played by the reference simulator (scripted policies) on the
default environment, its counts read off the outcome, and its reward computed by
``parl_reward`` at every PARL step from 0 to past the annealing:

* a task that needs one agent (n = 1) never profits from delegating it, however many
  sub-agents and whatever the step of the schedule;
* at n = 16 the eighth sub-agent always pays: "seven sub-agents and two own lookups"
  (also within the budget) is never the better answer (the "K - 1" optimum);
* the old default (``r_parallel = "work"``, no critical cost) fails the first
  property for the first ~100 steps: what the issue found, kept as a check that this
  test can fail.
"""

import importlib.util
import os
import random

import jax.numpy as jnp
import pytest

from swarmjax.envs import scripts
from swarmjax.envs.scoring import item_f1
from swarmjax.envs.widesearch import Episode, Vocab, score, scripted, simulate
from swarmjax.rl.parl import PARLConfig, parl_reward
from test_swarm import novel_ref, parallel_ref


def _default_config():
    path = os.path.join(os.path.dirname(__file__), "..", "configs", "parl_widesearch_cpu.py")
    spec = importlib.util.spec_from_file_location("parl_widesearch_cpu", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.ENV, mod.get_config().rl.parl


ENV, PCFG = _default_config()


def counts(ep: Episode, out) -> dict:
    """The per-episode counts ``parl_reward`` takes, from a reference outcome (host)."""
    correct, answered, truth = score(ep, out.answer)
    f1 = float(item_f1(jnp.array([correct]), jnp.array([answered]), jnp.array([truth]),
                       jnp.array([out.answer is not None]))[0])
    returned = len({e for st in out.stages for r in st["results"] if r for e, _ in r if e in ep.task})
    parallel, novel = parallel_ref(ep, out), novel_ref(ep, out)
    return dict(f1=f1, spawned=out.spawned, finished=out.finished, total=out.total_steps,
                critical=out.critical_steps, returned=returned, parallel=parallel, novel=novel,
                n=len(ep.task), answered=out.end_reason == "answer")


def reward(c: dict, step: int, pcfg: PARLConfig) -> float:
    one = lambda x: jnp.array([x], jnp.float32)
    r, _ = parl_reward(one(c["f1"]), one(c["spawned"]), one(c["finished"]), one(c["total"]), step, pcfg,
                       {k: one(c[k]) for k in ("returned", "parallel", "novel", "n")},
                       critical_steps=one(c["critical"]))
    return float(r[0])


def play(ep, orch, workers=()):
    return counts(ep, simulate(ENV, ep, scripted(orch), scripted([]), workers=[scripted(w) for w in workers]))


def strategies_n1(ep):
    """Serial, and every way of handing the one entity to 1..K sub-agents (all return)."""
    (e,) = ep.task
    out = {"serial": play(ep, scripts.serial(ENV, ep))}
    for k in range(1, ENV.max_subagents + 1):
        orch, work = scripts.delegate(ENV, ep, [[e]] * k)
        out[f"delegate x{k}"] = play(ep, orch, work)
    v = Vocab(ENV)   # delegate, and look it up as well
    orch, work = scripts.delegate(ENV, ep, [[e]])
    out["delegate + lookup"] = play(ep, orch[:2 + 1] + [v["<wait>"], v["<lookup>"], v.entity(e)]
                                    + scripts.answer(ENV, ep), work)
    return out


def strategies_n16(ep):
    v = Vocab(ENV)
    full, work8 = scripts.split(ENV, ep, 8)
    chunks = [ep.task[2 * i:2 * i + 2] for i in range(7)]
    orch7, work7 = scripts.delegate(ENV, ep, chunks)
    own = [t for e in ep.task[14:] for t in (v["<lookup>"], v.entity(e))]
    orch7 = orch7[:orch7.index(v["<answer>"])] + own + scripts.answer(ENV, ep)
    return {"8 x 2": play(ep, full, work8), "7 x 2 + 2 own": play(ep, orch7, work7)}


STEPS = range(0, PCFG.anneal_steps + 20, 5)


def test_strategies_are_what_they_claim():
    rng = random.Random(0)
    ep1 = Episode.sample(ENV, rng, n=1)
    s = strategies_n1(ep1)
    assert s["serial"]["critical"] == 2 and s["serial"]["spawned"] == 0 and s["serial"]["f1"] == 1.0
    for k in range(1, ENV.max_subagents + 1):
        d = s[f"delegate x{k}"]
        assert (d["spawned"], d["finished"], d["returned"], d["parallel"], d["f1"]) == (k, k, 1, 0, 1.0)
        assert d["critical"] == 4 and d["total"] == 2 + 2 * k
    ep16 = Episode.sample(ENV, rng, n=16)
    big = strategies_n16(ep16)
    assert (big["8 x 2"]["critical"], big["8 x 2"]["total"], big["8 x 2"]["parallel"]) == (5, 26, 14)
    seven = big["7 x 2 + 2 own"]
    assert (seven["critical"], seven["total"], seven["parallel"], seven["spawned"]) == (7, 25, 12, 7)
    assert seven["answered"] and seven["f1"] == 1.0 and big["8 x 2"]["f1"] == 1.0


@pytest.mark.parametrize("seed", range(3))
def test_one_agent_task_never_profits_from_delegating(seed):
    ep = Episode.sample(ENV, random.Random(seed), n=1)
    s = strategies_n1(ep)
    for step in STEPS:
        serial = reward(s["serial"], step, PCFG)
        for name, c in s.items():
            if name != "serial":
                assert reward(c, step, PCFG) < serial, (name, step)


def test_the_eighth_subagent_always_pays():
    ep = Episode.sample(ENV, random.Random(3), n=16)
    s = strategies_n16(ep)
    for step in STEPS:
        assert reward(s["8 x 2"], step, PCFG) > reward(s["7 x 2 + 2 own"], step, PCFG), step


def test_the_old_shaping_paid_for_delegating_one_entity():
    """What issue 15 found: "work" with lambda1 = 0.3 / 16 > 2 steps x 0.005 early on,
    and after the annealing the total-step cost ranks 7 sub-agents above 8."""
    old = PARLConfig(lambda1=0.3, lambda2=0.3, anneal_steps=200, parallel="work", parallel_target=16,
                     step_cost=0.005)
    ep = Episode.sample(ENV, random.Random(0), n=1)
    s = strategies_n1(ep)
    assert reward(s["delegate x1"], 0, old) > reward(s["serial"], 0, old)
    assert reward(s["delegate x1"], old.anneal_steps, old) < reward(s["serial"], old.anneal_steps, old)
    big = strategies_n16(Episode.sample(ENV, random.Random(3), n=16))
    assert reward(big["7 x 2 + 2 own"], old.anneal_steps, old) > reward(big["8 x 2"], old.anneal_steps, old)
