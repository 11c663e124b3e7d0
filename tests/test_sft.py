"""Warm start: demonstrations are valid protocol, the loss counts only the acting
agent's tokens, and a short SFT run improves both roles."""

import dataclasses
import os
import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from swarmjax.envs.widesearch import Episode, Vocab, WideSearchConfig
from swarmjax.models import ModelConfig, forward, init_params
from swarmjax.optim import OptimConfig
from swarmjax.roles import Roles
from swarmjax.train.demos import episode_demo, make_demos
from swarmjax.train.sft import SFTConfig, role_stats, train_sft

ENV = WideSearchConfig(num_entities=8, num_values=6, max_task_size=4, max_subagents=3,
                       subagent_steps=3, budget=None, contexts=Roles(48, 20))
V = Vocab(ENV)


def test_demonstrations_follow_the_protocol():
    rng = random.Random(0)
    delegated = 0
    for _ in range(200):
        ep = Episode.sample(ENV, rng)
        out = episode_demo(ENV, ep, rng, spawn_fraction=0.5)
        assert out.end_reason == "answer"
        # the answer holds only true values the orchestrator saw (no made-up values)
        assert all(ep.table[e] == v for e, v in out.answer)
        returned = [e for r in (r for s in out.stages for r in s["results"]) if r for e, _ in r]
        if out.spawned:
            delegated += 1
            # exactly the pairs that came back, in the order they came back
            assert [e for e, _ in out.answer] == returned
        else:
            assert [e for e, _ in out.answer] == ep.task and out.critical_steps == len(ep.task) + 1
    assert 60 < delegated < 140


def test_demonstrations_answer_what_a_cut_short_worker_returned():
    # a worker context of 24 holds two lookups and their return; given three entities,
    # a worker returns the two pairs it said before its context filled up
    env = WideSearchConfig(num_entities=16, num_values=8, max_task_size=8, max_subagents=4,
                           subagent_steps=4, budget=None, contexts=Roles(96, 24))
    rng, partial = random.Random(1), 0
    for _ in range(100):
        out = episode_demo(env, Episode.sample(env, rng), rng, spawn_fraction=1.0, max_chunk=3)
        if not out.spawned:                  # one-entity tasks are never delegated
            continue
        results = [r for s in out.stages for r in s["results"]]
        partial += any(r and len(r) == 2 and len(c) == 3 for r, c in zip(results, _blocks(out), strict=True))
        assert [e for e, _ in out.answer] == [e for r in results if r for e, _ in r]
    assert partial > 10


def _blocks(out):
    """The spawn blocks of an episode's orchestrator, in order."""
    blocks, cur = [], None
    for tok in out.orch_tokens:
        if tok == V["<spawn>"]:
            cur = []
        elif tok == V["</spawn>"]:
            blocks.append(cur)
            cur = None
        elif cur is not None:
            cur.append(tok)
    return blocks


def test_loss_counts_only_said_tokens():
    o, w = make_demos(ENV, 16, seed=1, spawn_fraction=0.5)
    cfg = ModelConfig(vocab_size=V.size, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                      head_dim=8, intermediate_size=32)
    params = init_params(cfg, jax.random.key(0))
    for d in (o, w):
        tokens, tmask, lmask = jnp.asarray(d.tokens), jnp.asarray(d.token_mask), jnp.asarray(d.loss_mask)
        nll, count, _ = role_stats(params, cfg, tokens, tmask, lmask)
        logits = np.asarray(forward(params, cfg, tokens, token_mask=tmask).logits, np.float64)
        logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        want = -sum(logp[b, t - 1, d.tokens[b, t]] for b in range(len(d)) for t in range(1, d.tokens.shape[1])
                    if d.loss_mask[b, t])
        assert int(count) == int(d.loss_mask[:, 1:].sum()) > 0
        np.testing.assert_allclose(float(nll), want, rtol=1e-4)
        # environment tokens and prompts are never in the loss
        said = d.tokens[d.loss_mask]
        assert not np.isin(said, [V["<val>"], V["<result>"], V["<task>"], V["<orch>"], V["<worker>"]]).any()


@pytest.mark.slow
def test_short_sft_run_improves_both_roles():
    cfg = ModelConfig(vocab_size=V.size, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                      head_dim=8, intermediate_size=96)
    scfg = SFTConfig(steps=60, batch=16, demos=256, eval_demos=64, spawn_fraction=0.25,
                     optim=OptimConfig(learning_rate=1e-2, warmup_steps=5, decay_steps=60))
    seen = []
    _, report = train_sft(init_params(cfg, jax.random.key(0)), cfg, ENV, scfg, lambda i, m: seen.append(i))
    assert seen == list(range(60))
    h = report["history"]
    assert np.mean([m["loss"] for m in h[-10:]]) < 0.6 * np.mean([m["loss"] for m in h[:5]])
    for role in ("orch", "worker"):
        assert report["after"][f"{role}_acc"] > report["before"][f"{role}_acc"] + 0.3, report


@pytest.mark.slow
def test_sft_qk_clip_and_held_out_curve():
    """QK-Clip follows every SFT step (as in the RL learner): a Llama-form model (no QK-norm)
    at a high learning rate grows its attention logits past tau; clipped, the next step's
    forward starts from logits <= tau, so the logged max stays near tau, unclipped it does not.
    ``eval_every`` adds the held-out figures to every eval_every-th step."""
    cfg = ModelConfig(vocab_size=V.size, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2,
                      head_dim=8, intermediate_size=64, qk_norm=False)
    run = lambda tau: train_sft(
        init_params(cfg, jax.random.key(0)), cfg, ENV,
        SFTConfig(steps=40, batch=8, demos=64, eval_demos=16,
                  optim=OptimConfig(learning_rate=5e-2, qk_clip_tau=tau)), eval_every=20)[1]
    free, clipped = run(float("inf")), run(3.0)
    free_max = max(m["max_attn_logit"] for m in free["history"])
    assert free_max > 6.0                                            # the logits do grow
    assert sum(m["qk_clip_heads"] for m in free["history"]) == 0     # inf: monitored, never clipped
    assert sum(m["qk_clip_heads"] for m in clipped["history"]) > 0
    # a step's max is measured before its own clip: one step's growth above tau at most
    assert max(m["max_attn_logit"] for m in clipped["history"]) < 0.5 * free_max
    assert [s for s, _ in clipped["evals"]] == [20, 40]
    assert "heldout_orch_acc" in clipped["history"][19] and "heldout_orch_acc" not in clipped["history"][18]
    assert clipped["evals"][-1][1] == clipped["after"]


def test_bad_sft_config():
    with pytest.raises(ValueError):
        SFTConfig(spawn_fraction=1.5)
    with pytest.raises(ValueError, match="did not finish"):
        make_demos(WideSearchConfig(budget=3), 8, seed=0)
    with pytest.raises(ValueError, match="contexts.orchestrator 40"):       # 3-way split of 4 needs 42 tokens
        make_demos(dataclasses.replace(ENV, contexts=Roles(40, ENV.contexts.subagents)), 200, seed=0,
                   spawn_fraction=0.5)


def test_prefix_role_stats_equal_role_stats():
    """Rows that open alike: the shared head run once (cascade attention) gives the same
    statistics and gradients as the rows in full; shared_head stops before the loss."""
    from swarmjax.rl.trajectory import shared_head
    from swarmjax.train.sft import prefix_role_stats
    cfg = ModelConfig(vocab_size=300, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                      intermediate_size=64)
    params = init_params(cfg, jax.random.key(0))
    rng = np.random.default_rng(0)
    B, P, T = 3, 7, 11
    tokens = np.concatenate([np.broadcast_to(rng.integers(0, 300, P), (B, P)), rng.integers(0, 300, (B, T))], 1)
    tokens[:, P] = 5                                   # rows still agree on the first id after the head
    token_mask = np.ones((B, P + T), bool)
    token_mask[1, -3:] = False
    loss_mask = token_mask & (np.arange(P + T) >= P + 1)
    head = shared_head(tokens, token_mask, loss_mask)
    assert head == P                                   # P + 1 agrees too, but its successor is scored
    # jitted: run op by op, each of the model's ops compiles on its own (30 s instead of 3)
    full = jax.jit(jax.value_and_grad(
        lambda p: role_stats(p, cfg, *map(jnp.asarray, (tokens, token_mask, loss_mask)))[0]))
    cut = jax.jit(jax.value_and_grad(lambda p: prefix_role_stats(
        p, cfg, jnp.asarray(tokens[0, :P]), *(jnp.asarray(x[:, P:]) for x in (tokens, token_mask, loss_mask)))[0]))
    (a, ga), (b, gb) = full(params), cut(params)
    np.testing.assert_allclose(b, a, rtol=1e-5)
    for x, y in zip(jax.tree.leaves(ga), jax.tree.leaves(gb)):
        np.testing.assert_allclose(y, x, rtol=1e-4, atol=1e-6)
    stats = lambda f, *args: [float(v) for v in jax.jit(f, static_argnums=1)(params, cfg, *args)]
    assert stats(role_stats, *map(jnp.asarray, (tokens, token_mask, loss_mask)))[1:] == \
        stats(prefix_role_stats, jnp.asarray(tokens[0, :P]), *(jnp.asarray(x[:, P:]) for x in (tokens, token_mask,
                                                                                               loss_mask)))[1:]


def test_warm_start_step_on_a_mesh_holds_a_share_of_the_logits():
    """The [B, T, V] logits dominate a warm-start step at a large vocabulary. On a mesh
    every device holds its rows' share (fsdp or data axes), not the whole: the compiled
    step's temporaries a device <= 1.5 x the one-device step's / 8 (XLA's own figure)."""
    from swarmjax.sharding.mesh import MeshConfig, batch_sharding, make_mesh
    from swarmjax.train.sft import sft_step

    cfg = ModelConfig(vocab_size=32_768, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
                      intermediate_size=64)
    params = init_params(cfg, jax.random.key(0))
    B, T = 8, 128
    rows = (jnp.zeros((B, T), jnp.int32), jnp.ones((B, T), bool), jnp.ones((B, T), bool))
    temp = {}
    for name, mesh in (("one", None), ("fsdp", make_mesh(MeshConfig(data=1, fsdp=8))),
                       ("data", make_mesh(MeshConfig(data=8)))):
        p, o, step = sft_step(params, cfg, OptimConfig(), roles=("agent",), mesh=mesh)
        batch = rows if mesh is None else tuple(jax.device_put(x, batch_sharding(mesh, 2, batch_size=B)) for x in rows)
        temp[name] = step.lower(p, o, batch).compile().memory_analysis().temp_size_in_bytes
    assert temp["one"] > B * T * cfg.vocab_size * 4                    # the logits are most of it
    for name in ("fsdp", "data"):
        assert temp[name] <= 1.5 * temp["one"] / 8, (name, temp)


def test_chunked_warm_start_loss_equals_the_whole_one():
    from swarmjax.train.sft import sft_loss

    cfg = ModelConfig(vocab_size=64, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
                      intermediate_size=64)
    params = init_params(cfg, jax.random.key(1))
    r = np.random.RandomState(0)
    tokens = jnp.asarray(r.randint(0, 64, (3, 21)))
    token_mask = jnp.asarray(np.arange(21)[None] < np.array([[21], [15], [9]]))
    loss_mask = token_mask & jnp.asarray(r.rand(3, 21) < 0.6)
    whole, chunked = (jax.value_and_grad(lambda p, c=c: sft_loss(p, cfg, [(tokens, token_mask, loss_mask)],
                                                                     roles=("agent",), logits_chunk=c),
                                         has_aux=True)(params) for c in (0, 4))
    np.testing.assert_allclose(chunked[0][0], whole[0][0], rtol=1e-5)
    assert float(chunked[0][1][0]["agent_acc"]) == float(whole[0][1][0]["agent_acc"])
    for a, b in zip(jax.tree.leaves(chunked[1]), jax.tree.leaves(whole[1])):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


class _Notice:
    """A preemption watch whose notice arrives at its ``at``-th safe point."""

    def __init__(self, at: int):
        self.at, self.calls = at, 0

    def reached(self) -> bool:
        self.calls += 1
        return self.calls == self.at


def test_a_stopped_warm_start_continues_exactly(tmp_path):
    """A warm start stopped by a preemption notice after step 3 of 6 (saves every 2: its
    save at 3 forced) and continued from its own checkpoint takes the uninterrupted run's
    steps: the same losses, the same params (optimizer state and batch sampler restored).
    Another identity's continue is refused; a fresh start removes the saves."""
    from swarmjax.train.preemption import Preempted
    from swarmjax.train.warm_steps import WarmSteps

    cfg = ModelConfig(vocab_size=V.size, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                      head_dim=8, intermediate_size=32)
    scfg = SFTConfig(steps=6, batch=4, demos=32, eval_demos=8, optim=OptimConfig(learning_rate=1e-2))
    run = lambda saves: train_sft(init_params(cfg, jax.random.key(0)), cfg, ENV, scfg, saves=saves)
    whole, whole_report = run(None)
    me = {"sft": "6 steps"}
    saves = WarmSteps(str(tmp_path), 2, resume=False, identity=me, watch=_Notice(3))
    with pytest.raises(Preempted, match="its checkpoint at step 3 saved") as stop:
        run(saves)
    saves.close()
    assert stop.value.warm_step == 3 and sorted(os.listdir(tmp_path / "warm_start_steps")) == ["3"]
    with pytest.raises(ValueError, match="differs from the run's in sft"):
        run(WarmSteps(str(tmp_path), 2, resume=True, identity={"sft": "7 steps"}))
    again = WarmSteps(str(tmp_path), 2, resume=True, identity=me)
    assert again.step == 3
    params, report = run(again)
    again.close()
    assert [m["loss"] for m in report["history"]] == [m["loss"] for m in whole_report["history"][3:]]
    assert all(jax.tree.leaves(jax.tree.map(lambda a, b: np.array_equal(np.asarray(a), np.asarray(b)),
                                            params, whole)))
    WarmSteps(str(tmp_path), 2, resume=False, identity=me)
    assert not os.path.exists(tmp_path / "warm_start_steps")
