"""The wide-search reference simulator on scripted episodes, and the PARL reward."""

import random

import jax.numpy as jnp
import numpy as np
import pytest

from swarmjax.envs import scripts
from swarmjax.envs.scoring import item_f1
from swarmjax.envs.widesearch import Episode, Vocab, WideSearchConfig, scripted, simulate
from swarmjax.rl.parl import PARLConfig, anneal, parl_reward
from swarmjax.roles import Roles

CFG = WideSearchConfig(budget=None)
V = Vocab(CFG)


def ep16():
    return Episode.sample(CFG, random.Random(0), n=16)


def serial_script(ep):
    return scripts.serial(CFG, ep)


def split_scripts(ep, parts):
    """Orchestrator spawns `parts` workers, each looks up its chunk and returns; then answers.
    The worker scripts are concatenated (the reference runs workers one after another)."""
    orch, work = scripts.split(CFG, ep, parts)
    return orch, [t for w in work for t in w]


def test_serial_episode_costs_n_plus_one():
    ep = ep16()
    out = simulate(CFG, ep, scripted(serial_script(ep)), scripted([]))
    assert out.end_reason == "answer" and out.answer == [(e, ep.table[e]) for e in ep.task]
    assert out.critical_steps == 17 == CFG.serial_critical_steps(16) and out.total_steps == 17
    assert out.spawned == 0
    text = V.decode(out.orch_tokens)
    assert text.startswith("<orch> <task> e") and f"<lookup> e{ep.task[0]} <val> v{ep.table[ep.task[0]]}" in text
    # the env's tokens are not sampled, the orchestrator's are
    assert out.sampled[: 18] == [False] * 18
    i = out.orch_tokens.index(V["<val>"])
    assert out.sampled[i - 2: i + 2] == [True, True, False, False]


def test_best_split_costs_five():
    ep = ep16()
    orch, work = split_scripts(ep, 8)
    out = simulate(CFG, ep, scripted(orch), scripted(work))
    assert (out.critical_steps, out.spawned, out.finished) == (5, 8, 8)     # 1 + 3 + 1
    assert out.total_steps == 2 + 8 * 3
    assert out.stages[0]["worker_steps"] == [3] * 8
    assert out.answer == [(e, ep.table[e]) for e in ep.task]
    assert V.decode(out.orch_tokens).count("<result>") == 8
    assert CFG.min_critical_steps(16) == out.critical_steps                # nothing beats it


def test_min_critical_steps():
    """The bound the config check uses: brute force over (delegated d, sub-agents k)."""
    for cfg in (CFG, WideSearchConfig(max_subagents=3, subagent_steps=3, contexts=Roles(256, 24)),
                WideSearchConfig(max_subagents=8, subagent_steps=4, contexts=Roles(256, 24))):
        c = cfg.worker_capacity
        for n in range(1, 17):
            best = n + 1
            for d in range(1, n + 1):
                for k in range(1, cfg.max_subagents + 1):
                    if -(-d // k) <= c:
                        best = min(best, 1 + -(-d // k) + 1 + (n - d) + 1)
            assert cfg.min_critical_steps(n) == best, (n, cfg)
    assert WideSearchConfig(subagent_steps=4, contexts=Roles(256, 24)).worker_capacity == 2


@pytest.mark.parametrize("context", [24, 25, 26, 32])
def test_worker_capacity_matches_the_simulator(context):
    """A worker given ``worker_capacity`` entities returns all of them; one more, and it
    cannot (checked on the reference simulator with the scripted worker)."""
    cfg = WideSearchConfig(subagent_steps=8, contexts=Roles(256, context), budget=None)
    c = cfg.worker_capacity
    ep = Episode.sample(cfg, random.Random(context), n=c + 1)
    for k, ok in ((c, True), (c + 1, False)):
        orch, work = split_scripts(Episode(table=ep.table, task=ep.task[:k]), 1)
        out = simulate(cfg, Episode(table=ep.table, task=ep.task[:k]), scripted(orch), scripted(work))
        got = out.stages[0]["results"][0]
        assert (got is not None and len(got) == k) == ok, (context, k, got)


def test_worker_out_of_steps_reports_fail():
    ep = Episode.sample(CFG, random.Random(1), n=6)
    orch = [V["<spawn>"], *(V.entity(e) for e in ep.task), V["</spawn>"], V["<wait>"],
            V["<answer>"], V["</answer>"]]
    work = [t for e in ep.task for t in (V["<lookup>"], V.entity(e))]   # 6 lookups > S_sub = 5
    out = simulate(CFG, ep, scripted(orch), scripted(work))
    assert out.stages[0]["worker_steps"] == [5] and out.finished == 0 and out.spawned == 1
    assert "<result> <fail> </result>" in V.decode(out.orch_tokens)
    assert out.critical_steps == 1 + 5 + 1 and out.answer == []


@pytest.mark.parametrize("bad,turns", [
    ("<spawn> </spawn> <wait>", 2),     # empty spawn; then a stray <wait>
    ("<spawn> v3 </spawn> <wait>", 3),  # a value where an entity belongs; two stray tokens
    ("<lookup> v7", 1),                 # lookup of a value token
    ("</task>", 1),                     # not a turn
])
def test_malformed_turns_get_fail_and_cost_a_step(bad, turns):
    # a turn ends at the token that breaks it; what follows is read as the next turn
    ep = Episode.sample(CFG, random.Random(2), n=2)
    orch = V.encode(bad) + V.encode("<answer> </answer>")
    out = simulate(CFG, ep, scripted(orch), scripted([]))
    assert out.orch_steps == turns + 1 and out.spawned == 0 and out.end_reason == "answer"
    assert V.decode(out.orch_tokens).split().count("<fail>") == turns


def test_the_kth_subagent_ends_the_spawn_turn():
    # K = 2: after the second block the environment says <wait> and launches both;
    # asking for a third sub-agent later is a malformed turn
    cfg = WideSearchConfig(budget=None, max_subagents=2)
    ep = Episode.sample(cfg, random.Random(3), n=3)
    orch = []
    for e in ep.task:
        orch += [V["<spawn>"], V.entity(e), V["</spawn>"]]
    orch += [V["<answer>"], V["</answer>"]]
    work = [scripted(scripts.worker(cfg, ep, [e])) for e in ep.task[:2]]
    out = simulate(cfg, ep, scripted(orch), scripted([]), workers=work)
    assert out.spawned == out.finished == 2 and out.end_reason == "answer"
    toks = V.decode(out.orch_tokens).split()
    wait = toks.index("<wait>")
    assert toks[wait - 1] == "</spawn>" and not out.sampled[wait]      # said by the environment
    assert toks[wait + 1:].count("<fail>") == 3     # the third <spawn>, its entity, its </spawn>
    assert out.critical_steps == 1 + 2 + 3 + 1      # spawn, worker (lookup + return), fails, answer


def test_budget_stops_serial_work():
    cfg = WideSearchConfig(budget=8)
    ep = Episode.sample(cfg, random.Random(0), n=16)
    out = simulate(cfg, ep, scripted(serial_script(ep)), scripted([]))
    assert out.end_reason == "budget" and out.critical_steps == 8 and out.answer is None
    orch, work = split_scripts(ep, 8)
    assert simulate(cfg, ep, scripted(orch), scripted(work)).end_reason == "answer"
    with pytest.raises(ValueError, match="budget"):
        WideSearchConfig(budget=1)


def test_context_limit_ends_the_episode():
    cfg = WideSearchConfig(budget=None, contexts=Roles(30, 48))
    ep = Episode.sample(cfg, random.Random(4), n=4)
    looping = [V["<lookup>"], V.entity(ep.task[0])] * 50
    out = simulate(cfg, ep, scripted(looping), scripted([]))
    assert out.end_reason == "context" and len(out.orch_tokens) == 30   # never over capacity


def test_vocab_round_trip():
    text = "<orch> <task> e1 e63 </task> <lookup> e1 <val> v0"
    assert V.decode(V.encode(text)) == text and V.size == 18 + 64 + 64


# ----------------------------------------------------------------------------- reward


def test_item_f1_and_parl_channels():
    f1 = item_f1(jnp.array([16, 8, 0, 4]), jnp.array([16, 8, 3, 16]), jnp.array([16, 16, 16, 4]),
                 jnp.array([True, True, True, True]))
    np.testing.assert_allclose(f1, [1.0, 2 / 3, 0.0, 0.4], rtol=1e-6)
    assert float(item_f1(jnp.array([5]), jnp.array([5]), jnp.array([5]), jnp.array([False]))[0]) == 0
    cfg = PARLConfig(lambda1=0.5, lambda2=0.2, anneal_steps=100, parallel_target=8, step_cost=0.01)
    r, ch = parl_reward(jnp.array([1.0, 1.0]), jnp.array([0, 8]), jnp.array([0, 6]),
                        jnp.array([17, 26]), 0, cfg, {"novel": jnp.array([0, 8])})
    np.testing.assert_allclose(ch["r_parallel"], [0, 1])
    np.testing.assert_allclose(ch["r_finish"], [1, 0.75])      # spawning nothing loses nothing
    np.testing.assert_allclose(r, [1 + 0.2 - 0.17, 1 + 0.5 + 0.2 * 0.75 - 0.26], rtol=1e-6)
    r_end, _ = parl_reward(jnp.array([1.0]), jnp.array([8]), jnp.array([8]), jnp.array([26]), 100, cfg,
                           {"novel": jnp.array([8])})
    np.testing.assert_allclose(r_end, [1 - 0.26], rtol=1e-6)   # auxiliary channels annealed away


def test_parallel_reward_forms():
    """r_parallel per closed form: 8 sub-agents on one entity earn one novel sub-agent;
    eight one-entity sub-agents on a 16-entity task earn half the coverage of 8 x 2."""
    f1, spawned, finished, steps = jnp.ones(3), jnp.array([8, 8, 8]), jnp.array([8, 8, 8]), jnp.array([10, 18, 26])
    counts = {"novel": jnp.array([1, 8, 8]), "returned": jnp.array([1, 8, 16]), "n": jnp.array([16, 16, 16])}
    got = {form: parl_reward(f1, spawned, finished, steps, 0, PARLConfig(parallel=form), counts)[1]["r_parallel"]
           for form in ("spawned", "novel", "coverage")}
    np.testing.assert_allclose(got["spawned"], [1, 1, 1])
    np.testing.assert_allclose(got["novel"], [1 / 8, 1, 1])
    np.testing.assert_allclose(got["coverage"], [1 / 16, 0.5, 1])
    work = parl_reward(f1, spawned, finished, steps, 0, PARLConfig(parallel="work", parallel_target=16), counts)
    np.testing.assert_allclose(work[1]["r_parallel"], [1 / 16, 0.5, 1])
    one = {"returned": jnp.array([1]), "n": jnp.array([1]), "novel": jnp.array([1])}   # a 1-entity task, delegated
    r = lambda form: parl_reward(jnp.ones(1), jnp.ones(1), jnp.ones(1), jnp.array([4]), 0,
                                 PARLConfig(parallel=form, parallel_target=16), one)[1]["r_parallel"]
    assert float(r("coverage")[0]) == 1.0 and float(r("work")[0]) == 1 / 16
    with pytest.raises(ValueError, match="needs counts"):
        parl_reward(f1, spawned, finished, steps, 0, PARLConfig(parallel="coverage"))
    with pytest.raises(ValueError, match="unknown parallel"):
        PARLConfig(parallel="more")


def test_schedules():
    lin = PARLConfig(lambda1=1.0, anneal_steps=10)
    cos = PARLConfig(lambda1=1.0, anneal_steps=10, schedule="cosine")
    np.testing.assert_allclose([float(anneal(1.0, s, lin)) for s in (0, 5, 10, 20)], [1, 0.5, 0, 0], atol=1e-6)
    np.testing.assert_allclose([float(anneal(1.0, s, cos)) for s in (0, 5, 10)], [1, 0.5, 0], atol=1e-6)
    with pytest.raises(ValueError):
        PARLConfig(schedule="step")
