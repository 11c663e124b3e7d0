"""The token world's PARL step (every job's RL step on the token engine): rollout -> the one
result type -> PARL reward -> group advantages -> GSPO update; its evaluation per task size."""

import dataclasses

import jax
import numpy as np
import pytest

from swarmjax.envs.widesearch import Vocab, WideSearchConfig
from swarmjax.models import ModelConfig, init_params
from swarmjax.optim import OptimConfig
from swarmjax.rl.losses import loss_preset
from swarmjax.rl.update import UpdateConfig
from swarmjax.roles import Roles
from swarmjax.swarm.engine import RolloutConfig
from swarmjax.train.agent_eval import by_size, evaluate
from swarmjax.train.agent_rl import collect
from swarmjax.train.parl import PARLTrainConfig, PARLTrainer, sample_eval_tasks

ENV = WideSearchConfig(num_entities=8, num_values=6, max_task_size=4, max_subagents=3,
                       subagent_steps=3, budget=6, contexts=Roles(48, 20))
CFG = ModelConfig(vocab_size=Vocab(ENV).size, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                  head_dim=8, intermediate_size=64)


@pytest.fixture(scope="module")
def trainer():
    cfg = PARLTrainConfig(rollout=RolloutConfig(env=ENV), tasks_per_step=4, group_size=4,
                          update=UpdateConfig(loss=loss_preset("gspo"), num_minibatches=2,
                                              optim=OptimConfig(learning_rate=1e-2)))
    return PARLTrainer(CFG, cfg)


def test_parl_step_updates_the_orchestrator_only(trainer):
    params = jax.tree.map(lambda x: x * 6 if x.ndim >= 2 else x, init_params(CFG, jax.random.key(0)))
    state = trainer.init(Roles.both(params))
    before = jax.tree.map(np.asarray, state.params)
    workers = jax.tree.map(np.asarray, state.frozen["subagents"])
    state, m = trainer.step(state, jax.random.key(1), step=0)
    for k in ("reward", "reward/r_parallel", "reward/r_finish", "reward/cost", "reward/lambda1", "reward/lambda2",
              "accuracy", "critical_steps", "subagents", "sampled_tokens", "learner/loss"):
        assert k in m and np.isfinite(m[k]), k
    assert m["reward/lambda1"] == pytest.approx(trainer.cfg.parl.lambda1)        # step 0: not annealed yet
    assert 1 <= m["critical_steps"] <= ENV.budget
    changed = jax.tree.map(lambda a, b: not np.allclose(a, np.asarray(b)), before, state.params)
    assert any(jax.tree.leaves(changed))
    same = jax.tree.map(lambda a, b: np.array_equal(a, np.asarray(b)), workers, state.frozen["subagents"])
    assert all(jax.tree.leaves(same))                                  # sub-agents stay frozen
    state, m2 = trainer.step(state, jax.random.key(2), step=1)
    assert int(state.step) == 2 * trainer.cfg.update.num_minibatches
    assert m2["reward/lambda1"] < m["reward/lambda1"]                  # annealing follows the step


def test_dynamic_sampling_masks_uniform_groups(trainer):
    """A batch whose groups all have equal rewards has no loss token left."""
    import swarmjax.envs.widesearch_jax as wsj

    cfg = dataclasses.replace(trainer.cfg, dynamic_sampling=True)
    problems = wsj.problems(wsj.reset(jax.random.key(0), ENV, 4))
    params = init_params(CFG, jax.random.key(0))
    greedy = dataclasses.replace(trainer.engine, rollout=trainer.engine.greedy_rollout)   # every group uniform
    got = collect(greedy, Roles.both(params), problems, jax.random.key(0), cfg)
    assert got.metrics["kept_groups"] == 0.0 and int(np.sum(got.batch.loss_mask)) == 0
    assert got.metrics["orch_sampled_tokens"] > 0


def test_kl_to_the_warm_start(trainer):
    """With kl_beta > 0 the starting orchestrator is kept as the KL reference: the KL
    term is reported (positive once the first minibatch moved the params) and the
    reference stays frozen."""
    loss = dataclasses.replace(trainer.cfg.update.loss, kl_beta=0.1)
    t = PARLTrainer(CFG, dataclasses.replace(trainer.cfg, update=dataclasses.replace(trainer.cfg.update, loss=loss)))
    params = jax.tree.map(lambda x: x * 6 if x.ndim >= 2 else x, init_params(CFG, jax.random.key(0)))
    state = t.init(Roles.both(params))
    ref = jax.tree.map(np.asarray, state.frozen["reference"])
    assert all(jax.tree.leaves(jax.tree.map(np.array_equal, ref, jax.tree.map(np.asarray, params))))
    state, m = t.step(state, jax.random.key(1), step=0)
    assert "learner/kl_ref" in m and m["learner/kl_ref"] > 0.0
    same = jax.tree.map(lambda a, b: np.array_equal(a, np.asarray(b)), ref, state.frozen["reference"])
    assert all(jax.tree.leaves(same))


def test_evaluate_per_task_size(trainer):
    """The token engine through every job's evaluation: greedy, the budget lifted, calls of
    one size each; per-size figures in range."""
    params = init_params(CFG, jax.random.key(0))
    problems = sample_eval_tasks(jax.random.key(1), ENV, [1, 4], 8)
    engine = dataclasses.replace(trainer.engine, batch=8)
    episodes = evaluate(engine, Roles.both(params), problems, jax.random.key(0))
    out = by_size(np.asarray([int(p["n"]) for p in problems]), episodes)
    assert set(out) == {"1", "4"}
    for row in out.values():
        assert 0.0 <= row["finished_subagents"] <= row["subagents"]
        assert 0.0 <= row["accuracy"] <= 1.0 and 0.0 <= row["answered"] <= 1.0
        assert row["critical_steps"] >= 1


def test_bad_parl_config():
    with pytest.raises(ValueError, match="divisible"):
        PARLTrainConfig(tasks_per_step=3, group_size=3)
    with pytest.raises(ValueError, match="advantage"):
        PARLTrainConfig(advantage="ppo")


