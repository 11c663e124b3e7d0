"""Differential tests: the jitted swarm engine against the pure-Python reference simulator.

Both are driven by the same tokens: scripted policies (serial, splits of several
shapes, malformed turns, budget and context overruns, sub-agents out of steps),
randomized scripts, and a random-weight model whose sampled tokens are replayed
through the reference. Every field of every episode must agree: the orchestrator's
tokens (so every environment token), the loss mask, step counts, critical steps,
answers, sub-agent contexts, and the rewards.
"""

import dataclasses
import pathlib
import random
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from swarmjax.envs import scripts
from swarmjax.envs import widesearch_jax as wsj
from swarmjax.envs.widesearch import Episode, Vocab, WideSearchConfig, score, scripted, simulate
from swarmjax.models import ModelConfig, init_params
from swarmjax.rl.parl import PARLConfig
from swarmjax.roles import Roles
from swarmjax.sampling.processors import SamplingConfig
from swarmjax.sharding.mesh import MeshConfig, make_mesh
from swarmjax.swarm import lanes
from swarmjax.swarm.engine import INDEX_CHECKS, SAMPLE, RolloutConfig, Scripts, SwarmRollout, index_errors
from swarmjax.swarm.outcome import episodes, parallel_entities, returned_entities, text_result, to_outcomes
from swarmjax.train.agent_rl import collect, episode_rewards
from swarmjax.train.parl import PARLTrainConfig, PARLTrainer
from test_widesearch import serial_script, split_scripts

sys.path.append(str(pathlib.Path(__file__).resolve().parents[1] / "bench"))
from fuzz import grammar_orchestrator, grammar_worker, novel_ref, parallel_ref  # noqa: E402  (shared with bench/fuzz.py)

# Default sizes, with a budget serial work cannot meet at n = 16.
BIG = WideSearchConfig(budget=10)
# Small everything, so random play hits every limit: context, steps, spawns, budget.
SMALL = WideSearchConfig(num_entities=8, num_values=6, min_task_size=1, max_task_size=4,
                         max_subagents=3, subagent_steps=3, budget=12, contexts=Roles(40, 14))


def model_for(cfg: WideSearchConfig) -> ModelConfig:
    return ModelConfig(vocab_size=Vocab(cfg).size, hidden_size=32, num_layers=2, num_heads=4,
                       num_kv_heads=2, head_dim=8, intermediate_size=64)


@pytest.fixture(scope="module")
def engines():
    """One engine (and random params) per environment config, shared by the tests."""
    out = {}
    for name, cfg in (("big", BIG), ("small", SMALL)):
        mcfg = model_for(cfg)
        params = jax.tree.map(lambda x: x * 6 if x.ndim >= 2 else x, init_params(mcfg, jax.random.key(1)))
        out[name] = (cfg, SwarmRollout(RolloutConfig(env=cfg), mcfg), params)
    return out


def pad_scripts(orch, workers, K):
    lo = max(1, max(len(s) for s in orch))
    lw = max(1, max((len(s) for ws in workers for s in ws), default=1))
    o = np.full((len(orch), lo), -1, np.int32)
    w = np.full((len(orch), K, lw), -1, np.int32)
    for b, s in enumerate(orch):
        o[b, :len(s)] = s
        for k, ws in enumerate(workers[b]):
            w[b, k, :len(ws)] = ws
    return Scripts(orch=jnp.asarray(o), workers=jnp.asarray(w))


def tasks_from(cfg, eps):
    N = cfg.max_task_size
    return wsj.Tasks(table=jnp.asarray([e.table for e in eps], jnp.int32),
                     entities=jnp.asarray([e.task + [-1] * (N - len(e.task)) for e in eps], jnp.int32),
                     n=jnp.asarray([len(e.task) for e in eps], jnp.int32))


def assert_same(cfg, eps, result, refs):
    """Every field of every episode agrees, and the engine's verifier and rewards
    equal the reference's."""
    res = text_result(cfg, result)                    # the one result type, what every job trains on
    outs = to_outcomes(cfg, res)
    pcfg = PARLConfig()
    reward, ch = episode_rewards(res, PARLTrainConfig(rollout=RolloutConfig(env=cfg), parl=pcfg), 0)
    for b, (ep, got, want) in enumerate(zip(eps, outs, refs)):
        for f in dataclasses.fields(want):
            assert getattr(got, f.name) == getattr(want, f.name), (b, f.name, Vocab(cfg).decode(want.orch_tokens))
        correct, answered, truth = score(ep, want.answer)
        assert (int(result.correct[b]), int(result.answered[b]), int(result.truth[b])) == (correct, answered, truth)
        p = correct / max(answered, 1)
        r = correct / truth
        f1 = 2 * p * r / (p + r) if want.answer is not None and correct else 0.0
        assert float(ch["r_perf"][b]) == pytest.approx(f1, abs=1e-6)
        assert float(ch["r_parallel"][b]) * pcfg.parallel_target == min(novel_ref(ep, want), pcfg.parallel_target)
        returned = {e for st in want.stages for r in st["results"] if r for e, _ in r if e in ep.task}
        assert int(returned_entities(result)[b]) == len(returned), b
        assert int(parallel_entities(result)[b]) == parallel_ref(ep, want), b
        want_reward = (f1 + pcfg.lambda1 * min(novel_ref(ep, want), pcfg.parallel_target) / pcfg.parallel_target
                       + pcfg.lambda2 * (want.finished / want.spawned if want.spawned else 1.0)
                       - pcfg.step_cost * want.total_steps)
        assert float(reward[b]) == pytest.approx(want_reward, abs=1e-5)


def run_scripted(engine, cfg, params, eps, orch, workers, mesh_engine=None):
    K = cfg.max_subagents
    workers = [list(ws) + [[]] * (K - len(ws)) for ws in workers]
    scripts = pad_scripts(orch, workers, K)
    result = (mesh_engine or engine)(Roles.both(params), tasks_from(cfg, eps), jax.random.key(0), scripts=scripts)
    refs = [simulate(cfg, ep, scripted(o), scripted([]), workers=[scripted(s) for s in ws])
            for ep, o, ws in zip(eps, orch, workers)]
    assert_same(cfg, eps, result, refs)
    return result, refs


@pytest.mark.slow
def test_scripted_shapes(engines):
    """Serial (over budget), and the 16 entities split 8x2, 4x4, 2x8, 16x1 (too many), all
    with one batch; plus a worker that runs out of steps and malformed spawns."""
    cfg, engine, params = engines["big"]
    v = Vocab(cfg)
    rng = random.Random(0)
    eps = [Episode.sample(cfg, rng, n=16) for _ in range(8)]
    orch, workers = [serial_script(eps[0])], [[]]
    for ep, parts in zip(eps[1:5], (8, 4, 2, 16)):
        o, _ = split_scripts(ep, parts)
        orch.append(o)
        workers.append([scripts.worker(cfg, ep, c) for c in scripts.chunks(ep.task, parts)[:8]])
    # a worker with 6 lookups (> S_sub = 5 steps) next to a good one
    ep = eps[5]
    orch.append(v.encode(f"<spawn> e{ep.task[0]} </spawn> <spawn> e{ep.task[1]} </spawn> <wait> <answer> </answer>"))
    workers.append([[v["<lookup>"], v.entity(ep.task[0])] * 6, scripts.worker(cfg, ep, ep.task[1:2])])
    # malformed spawns: empty block, value in a block, garbage after </spawn>; then serial lookups
    ep = eps[6]
    orch.append(v.encode(f"<spawn> </spawn> <spawn> v1 <spawn> e{ep.task[0]} </spawn> <lookup> "
                         f"<lookup> e{ep.task[0]} <answer> e{ep.task[0]} v{ep.table[ep.task[0]]} </answer>"))
    workers.append([])
    # a spawn of 2 where the orchestrator answers before <wait>
    orch.append(v.encode(f"<spawn> e{eps[7].task[0]} </spawn> <answer> </answer>"))
    workers.append([])
    result, refs = run_scripted(engine, cfg, params, eps, orch, workers)
    assert [r.end_reason for r in refs[:5]] == ["budget", "answer", "answer", "answer", "budget"]
    # 8x2 = 1+3+1, 4x4 = 1+5+1; 2x8 needs 9 steps per worker > S_sub = 5: both fail at 5
    assert [r.critical_steps for r in refs[1:4]] == [5, 7, 7]
    # 16 blocks: the environment launches the first 8 (K = 8) with its own <wait>; the
    # 9th <spawn> and what follows are read as malformed turns until the budget ends it
    assert refs[4].stages[0]["worker_steps"] == [2] * 8 and refs[4].spawned == 8
    assert refs[4].orch_tokens.count(v["<fail>"]) >= 1
    assert (refs[1].finished, refs[2].finished, refs[3].finished) == (8, 4, 0)
    assert refs[5].stages[0]["worker_steps"] == [5, 2] and refs[5].finished == 1


def random_batch(cfg, seed, size):
    """Episodes with bench/fuzz.py's protocol-shaped random scripts (every kind of turn,
    valid and malformed; stray tokens from the task's vocabulary only)."""
    rng = random.Random(seed)
    eps = [Episode.sample(cfg, rng) for _ in range(size)]
    nrng = np.random.default_rng(seed)
    orch = [grammar_orchestrator(cfg, ep, nrng, stray_ids=0) for ep in eps]
    workers = [[grammar_worker(cfg, ep, nrng, stray_ids=0) for _ in range(cfg.max_subagents)] for ep in eps]
    return eps, orch, workers


@pytest.mark.slow
def test_randomized_scripts(engines):
    """Random turns of every kind (valid and malformed) on the small config, which
    makes episodes hit the context, step, spawn and budget limits."""
    cfg, engine, params = engines["small"]
    eps, orch, workers = random_batch(cfg, 1, 48)
    _, refs = run_scripted(engine, cfg, params, eps, orch, workers)
    reasons = {r.end_reason for r in refs}
    assert reasons == {"answer", "budget", "context"}, reasons      # every ending is exercised
    assert any(r.spawned for r in refs) and any(r.finished < r.spawned for r in refs)
    assert any(s == cfg.subagent_steps for r in refs for st in r.stages for s in st["worker_steps"])


@pytest.mark.slow
def test_starved_lane_pool_changes_timing_not_outcomes(engines):
    """One KV-cache lane for 48 x 3 sub-agent slots: sub-agents queue for it, the
    loop runs far more ticks, and every episode still matches the reference."""
    cfg, engine, params = engines["small"]
    eps, orch, workers = random_batch(cfg, 1, 48)
    starved = SwarmRollout(dataclasses.replace(engine.rcfg, subagent_lanes=1), engine.cfgs)
    result, refs = run_scripted(engine, cfg, params, eps, orch, workers, mesh_engine=starved)
    full = SwarmRollout(dataclasses.replace(engine.rcfg, subagent_lanes=10 ** 6), engine.cfgs)
    assert starved.rcfg.lanes_per_group(48 * cfg.max_subagents) == 1
    assert sum(r.spawned for r in refs) > 10
    baseline, _ = run_scripted(engine, cfg, params, eps, orch, workers, mesh_engine=full)
    assert int(result.ticks) > 2 * int(baseline.ticks)


def replay(cfg, eps, result):
    """Feed the engine's sampled tokens back through the reference simulator."""
    r = jax.device_get(result)
    refs = []
    for b, ep in enumerate(eps):
        orch = [int(t) for t, s in zip(r.tokens[b], r.loss_mask[b]) if s]
        workers = [[int(t) for t, s in zip(r.worker_tokens[b, k], r.worker_sampled[b, k]) if s]
                   for k in range(cfg.max_subagents)]
        refs.append(simulate(cfg, ep, scripted(orch), scripted([]), workers=[scripted(w) for w in workers]))
    return refs


@pytest.mark.parametrize("which", ["small", "big"])
def test_random_model_episodes_replay_exactly(engines, which):
    cfg, engine, params = engines[which]
    tasks = wsj.reset(jax.random.key(3), cfg, 16)
    result = engine(Roles.both(params), tasks, jax.random.key(4))
    eps = episodes(tasks)
    refs = replay(cfg, eps, result)
    assert_same(cfg, eps, result, refs)
    assert sum(len(r.stages) for r in refs) > 16          # the random policy did act
    # log-probs are there exactly on sampled tokens, and are log-probabilities
    lp, mask = np.asarray(result.logprobs), np.asarray(result.loss_mask)
    assert np.all(lp[mask] < 0) and np.all(lp[~mask] == 0)


# ----------------------------------------------------------------------------- max_ticks: a bound, not a truncation


def spawn_then_sample(cfg, eps, per_block=2):
    """Scripts whose orchestrators first spawn K sub-agents (blocks of ``per_block`` task
    entities; the K-th block's ``</spawn>`` makes the environment say ``<wait>``), then
    let the model sample every other token (:data:`SAMPLE`), sub-agents included."""
    v, K = Vocab(cfg), cfg.max_subagents
    orch = np.full((len(eps), cfg.contexts.orchestrator), SAMPLE, np.int32)
    for b, ep in enumerate(eps):
        toks = []
        for k in range(K):
            block = [v.entity(ep.task[(k * per_block + i) % len(ep.task)]) for i in range(per_block)]
            toks += [v["<spawn>"], *block, v["</spawn>"]]
        orch[b, :len(toks)] = toks
    return Scripts(orch=jnp.asarray(orch), workers=jnp.full((len(eps), K, cfg.contexts.subagents), SAMPLE, jnp.int32))


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_random_model_at_the_largest_sizes_is_never_cut(engines, temperature):
    """The largest sizes (the defaults with the budget lifted, n = 16), a random model
    sampling at temperature 1 and 2, one KV-cache lane for the 16 x 8 sub-agent slots.
    Random models never spawn on their own, so every orchestrator first spawns 8
    sub-agents (forced), then the model samples everything: 128 sub-agents queue for
    the one lane, no episode is cut by max_ticks, and every episode replays exactly."""
    _, big, params = engines["big"]
    cfg, B = WideSearchConfig(budget=None), 16
    K = cfg.max_subagents
    s = SamplingConfig(temperature=temperature)
    engine = SwarmRollout(RolloutConfig(env=cfg, sampling=Roles.both(s), subagent_lanes=1),
                          big.cfgs)
    tasks = wsj.reset(jax.random.key(7), cfg, B, n=cfg.max_task_size)
    eps = episodes(tasks)
    script = spawn_then_sample(cfg, eps)
    result = engine(Roles.both(params), tasks, jax.random.key(8), scripts=script)
    assert engine.rcfg.lanes_per_group(B * K) == 1
    assert int(result.cut_by_max_ticks) == 0 and not np.any(np.asarray(result.end_reason) == wsj.RUNNING)
    assert int(jnp.sum(result.spawned)) == B * K
    # one lane: the sub-agents' tokens went through it one per tick
    assert int(jnp.sum(result.worker_length)) <= int(result.ticks) <= engine.rcfg.max_ticks(B * K)
    assert_same(cfg, eps, result, replay(cfg, eps, result))
    # forced tokens carry the model's log-prob, sampled ones the sampler's (temperature T)
    P = 4 * K                                                                        # K x "<spawn> e e </spawn>"
    mask = np.asarray(result.loss_mask)
    said = [np.asarray(result.tokens)[b][mask[b]] for b in range(B)]
    lp = [np.asarray(result.logprobs)[b][mask[b]] - np.asarray(result.model_logprobs)[b][mask[b]] for b in range(B)]
    assert all(np.array_equal(said[b][:P], np.asarray(script.orch)[b, :P]) and np.all(lp[b][:P] == 0)
               for b in range(B))
    sampled_gap = np.concatenate([d[P:] for d in lp])
    assert len(sampled_gap) > B and (np.any(np.abs(sampled_gap) > 1e-3) if temperature != 1.0
                                     else np.allclose(sampled_gap, 0, atol=1e-5))


def test_max_ticks_holds_where_it_is_nearly_reached(engines):
    """The bound's worst case: one lane for all 48 x 3 sub-agent slots, every sub-agent
    filling its context (a return whose pairs never close). The loop runs within one
    tick per sub-agent of max_ticks (so one extra tick per lane hand-over would cut
    episodes) and cuts none; every episode matches the reference."""
    cfg, engine, params = engines["small"]
    starved = SwarmRollout(dataclasses.replace(engine.rcfg, subagent_lanes=1), engine.cfgs)
    B, K, W = 48, cfg.max_subagents, cfg.contexts.subagents
    v = Vocab(cfg)
    rng = random.Random(2)
    eps = [Episode.sample(cfg, rng, n=cfg.max_task_size) for _ in range(B)]
    orch = [[t for e in ep.task[:K] for t in (v["<spawn>"], v.entity(e), v["</spawn>"])] for ep in eps]
    workers = [[[v["<return>"]] + [v.entity(ep.task[0]), v.value(0)] * W] * K for ep in eps]
    result, refs = run_scripted(engine, cfg, params, eps, orch, workers, mesh_engine=starved)
    bound = starved.rcfg.max_ticks(B * K)
    assert int(result.cut_by_max_ticks) == 0
    assert bound - B * K < int(result.ticks) <= bound, (int(result.ticks), bound)
    assert all(r.spawned == K and all(len(t) == W for t in r.worker_tokens) for r in refs)


class ShortLoop(RolloutConfig):
    """A loop bound far below the proven one, so that episodes are cut."""

    def max_ticks(self, slots: int) -> int:
        return 12


def test_cut_episodes_are_counted_and_reported(engines):
    """With max_ticks too small, the cut episodes come back ``running``, the rollout
    counts them, and the PARL step metrics report the count."""
    cfg, engine, params = engines["small"]
    trainer = PARLTrainer(engine.cfgs, PARLTrainConfig(rollout=ShortLoop(env=cfg), tasks_per_step=4,
                                                           group_size=4))
    problems = wsj.problems(wsj.reset(jax.random.key(0), cfg, 4))
    tasks, _ = wsj.repeat_groups(wsj.stack(problems), 4)
    result = trainer.engine.rollout(Roles.both(params), tasks, jax.random.key(1))
    cut = np.asarray(result.end_reason) == wsj.RUNNING
    assert int(result.ticks) == 12 and 0 < cut.sum() == int(result.cut_by_max_ticks)
    assert [o.end_reason == "running" for o in to_outcomes(cfg, text_result(cfg, result))] == list(cut)
    got = collect(trainer.engine, Roles.both(params), problems, jax.random.key(1), trainer.cfg)
    assert got.metrics["cut_by_max_ticks"] == cut.sum()
    full = engine(Roles.both(params), tasks, jax.random.key(1))
    assert int(full.cut_by_max_ticks) == 0 and full.index_errors is None


def test_index_checks_flag_what_is_out_of_range():
    """The in-loop index checks on hand-made ticks of 2 episodes: nothing in range is
    flagged; a write at the scratch slot C, a sub-agent writing at W without a lane,
    and lane maps that disagree are, on the right episodes."""
    cfg, B = SMALL, 2
    K, C, W = cfg.max_subagents, cfg.contexts.orchestrator, cfg.contexts.subagents
    o, w = wsj.init_state(cfg, wsj.reset(jax.random.key(0), cfg, B))
    pool, _ = lanes.allocate(lanes.init_lanes(1, B * K, 2), jnp.zeros((1, B * K), bool).at[0, K].set(True))
    zero, no = jnp.zeros((B,), jnp.int32), jnp.zeros((B,), bool)
    wzero, wno = jnp.zeros((B, K), jnp.int32), jnp.zeros((B, K), bool)

    def flagged(pool=pool, orch=(zero, no, zero), workers=(wzero, wno, wzero)):
        err = np.asarray(index_errors(cfg, o, w, pool, orch, workers, wno))
        return [{INDEX_CHECKS[i] for i in np.nonzero(row)[0]} for row in err]

    assert flagged() == [set(), set()]
    assert flagged(orch=(zero, jnp.array([True, True]), jnp.array([C, C - 1]))) == [{"orch_slot"}, set()]
    we = wno.at[0, 1].set(True)
    assert flagged(workers=(wzero, we, wzero.at[0, 1].set(W))) == [{"worker_slot", "lane_missing"}, set()]
    assert flagged(workers=(wzero, wno.at[1, 0].set(True), wzero)) == [set(), set()]   # it holds lane 0
    two_owners = pool.replace(owner=pool.owner.at[0, 1].set(K))                # lane 1 claims slot K too
    assert flagged(pool=two_owners) == [{"lane_owner"}, {"lane_owner"}]       # charged to the whole group
    assert flagged(pool=pool.replace(lane_of=pool.lane_of.at[0, 0].set(2))) == [{"lane_id", "lane_owner"}, set()]


@pytest.mark.slow
def test_sharded_engine_matches_the_reference(engines):
    """The differential tests again on a 2x2x2 mesh of 8 devices: scripted episodes,
    then sampled ones (episodes split over data x fsdp, weights over tensor)."""
    cfg, engine, params = engines["small"]
    mesh = make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
    sharded = SwarmRollout(engine.rcfg, engine.cfgs, mesh=mesh)
    eps, orch, workers = random_batch(cfg, 5, 16)
    result, _ = run_scripted(engine, cfg, params, eps, orch, workers, mesh_engine=sharded)
    assert len(result.tokens.sharding.device_set) == 8
    assert result.tokens.sharding.shard_shape(result.tokens.shape)[0] == 4     # 16 episodes / 4
    tasks = wsj.reset(jax.random.key(6), cfg, 16)
    sampled = sharded(Roles.both(params), tasks, jax.random.key(0))
    assert_same(cfg, episodes(tasks), sampled, replay(cfg, episodes(tasks), sampled))


def test_reset_and_groups():
    cfg = SMALL
    tasks = wsj.reset(jax.random.key(0), cfg, 64)
    n = np.asarray(tasks.n)
    assert n.min() >= cfg.min_task_size and n.max() <= cfg.max_task_size
    for b in range(64):
        ents = np.asarray(tasks.entities[b])
        assert len(set(ents[:n[b]])) == n[b] and np.all(ents[n[b]:] == -1)
    rep, groups = wsj.repeat_groups(tasks, 4)
    assert rep.n.shape == (256,) and np.all(np.asarray(groups) == np.repeat(np.arange(64), 4))
    np.testing.assert_array_equal(np.asarray(rep.table[4:8]), np.repeat(np.asarray(tasks.table[1:2]), 4, 0))


def test_vocab_too_small_is_a_clear_error():
    with pytest.raises(ValueError, match="vocab_size"):
        SwarmRollout(RolloutConfig(env=SMALL), model_for(SMALL).replace(vocab_size=10))


def test_one_base_under_the_orchestrator_and_its_sub_agents():
    """A LoRA orchestrator and sub-agents that are another adapter over the same base, in
    the token swarm: the two roles' params hold one copy of the base (the same device
    buffers), and the episodes (ids, sub-agents' ids, log-probs) are those of two separate
    models with the adapters merged into their weights."""
    from swarmjax.models.config import LoraConfig
    from swarmjax.models.lora import frozen_part, init_lora, merge, over_base

    cfg, base_cfg = SMALL, model_for(SMALL)
    lcfg = base_cfg.replace(lora=LoraConfig(rank=4))
    params = jax.tree.map(lambda x: x * 6 if x.ndim >= 2 else x, init_params(base_cfg, jax.random.key(1)))

    def adapters(seed):            # trained-looking adapters: B not zero
        fresh = init_lora(lcfg, jax.random.key(seed))
        return jax.tree_util.tree_map_with_path(lambda p, x: x if p[-1].key.endswith("_clip") else
                                                x + jax.random.normal(jax.random.key(seed + x.size), x.shape), fresh)
    orch = {**params, "lora": adapters(2)}
    roles = Roles(orch, over_base({"lora": adapters(3)}, orch))
    buffers = {x.unsafe_buffer_pointer(): x.nbytes for x in jax.tree.leaves(roles)}
    base_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
    assert sum(buffers.values()) == base_bytes + 2 * sum(x.nbytes for x in jax.tree.leaves(frozen_part(orch)))
    greedy = RolloutConfig(env=cfg, sampling=Roles.both(SamplingConfig(temperature=0.0)))
    tasks = wsj.reset(jax.random.key(3), cfg, 8)
    scripts = spawn_then_sample(cfg, episodes(tasks))     # sub-agents spawned, then every id sampled
    got = SwarmRollout(greedy, lcfg)(roles, tasks, jax.random.key(4), scripts=scripts)
    want = SwarmRollout(greedy, base_cfg)(Roles(merge(roles.orchestrator, lcfg), merge(roles.subagents, lcfg)),
                                          tasks, jax.random.key(4), scripts=scripts)
    assert int(got.spawned.sum()) > 0                                   # the sub-agents did decode
    for name in ("tokens", "worker_tokens", "length", "worker_length"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
    np.testing.assert_allclose(got.logprobs, want.logprobs, atol=2e-4)
