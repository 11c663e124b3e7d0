"""The PARL training step: rollout -> PARL reward -> group advantages -> GSPO update."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from swarmjax.envs.widesearch import Vocab, WideSearchConfig
from swarmjax.models import ModelConfig, init_params
from swarmjax.optim import OptimConfig
from swarmjax.rl.losses import loss_preset
from swarmjax.rl.update import UpdateConfig
from swarmjax.swarm.engine import RolloutConfig, SwarmRollout
from swarmjax.train.parl import PARLTrainConfig, PARLTrainer, evaluate, greedy, sample_eval_tasks

ENV = WideSearchConfig(num_entities=8, num_values=6, max_task_size=4, max_subagents=3,
                       subagent_steps=3, budget=6, orch_context=48, worker_context=20)
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
    state = trainer.init(params, worker_params=params)
    before = jax.tree.map(np.asarray, state.params)
    workers = jax.tree.map(np.asarray, state.frozen["subagents"])
    state, m = trainer.step(state, jax.random.key(1), step=0)
    for k in ("reward", "r_perf", "r_parallel", "r_finish", "cost", "lambda1", "lambda2", "item_f1",
              "critical_steps", "subagents", "learner/loss"):
        assert k in m and np.isfinite(m[k]), k
    assert m["lambda1"] == pytest.approx(trainer.cfg.parl.lambda1)        # step 0: not annealed yet
    assert 1 <= m["critical_steps"] <= ENV.budget
    changed = jax.tree.map(lambda a, b: not np.allclose(a, np.asarray(b)), before, state.params)
    assert any(jax.tree.leaves(changed))
    same = jax.tree.map(lambda a, b: np.array_equal(a, np.asarray(b)), workers, state.frozen["subagents"])
    assert all(jax.tree.leaves(same))                                  # sub-agents stay frozen
    state, m2 = trainer.step(state, jax.random.key(2), step=1)
    assert int(state.step) == 2 * trainer.cfg.update.num_minibatches
    assert m2["lambda1"] < m["lambda1"]                                # annealing follows the step


def test_dynamic_sampling_masks_uniform_groups(trainer):
    """A batch whose groups all have equal rewards has no loss token left."""
    cfg = dataclasses.replace(trainer.cfg, dynamic_sampling=True)
    t = PARLTrainer(CFG, cfg)
    import swarmjax.envs.widesearch_jax as wsj
    tasks, groups = wsj.repeat_groups(wsj.reset(jax.random.key(0), ENV, 4), 4)
    params = init_params(CFG, jax.random.key(0))
    g = SwarmRollout(greedy(cfg.rollout, ENV.budget), CFG)         # greedy: every group is uniform
    result = g(params, params, tasks, jax.random.key(0))
    batch, metrics = t._rewards(result, groups, jnp.int32(0))
    assert float(metrics["kept_groups"]) == 0.0 and int(jnp.sum(batch.loss_mask)) == 0
    assert int(jnp.sum(result.loss_mask)) > 0


def test_kl_to_the_warm_start(trainer):
    """With kl_beta > 0 the starting orchestrator is kept as the KL reference: the KL
    term is reported (positive once the first minibatch moved the params) and the
    reference stays frozen."""
    loss = dataclasses.replace(trainer.cfg.update.loss, kl_beta=0.1)
    t = PARLTrainer(CFG, dataclasses.replace(trainer.cfg, update=dataclasses.replace(trainer.cfg.update, loss=loss)))
    params = jax.tree.map(lambda x: x * 6 if x.ndim >= 2 else x, init_params(CFG, jax.random.key(0)))
    state = t.init(params, worker_params=params)
    ref = jax.tree.map(np.asarray, state.frozen["reference"])
    assert all(jax.tree.leaves(jax.tree.map(np.array_equal, ref, jax.tree.map(np.asarray, params))))
    state, m = t.step(state, jax.random.key(1), step=0)
    assert "learner/kl_ref" in m and m["learner/kl_ref"] > 0.0
    same = jax.tree.map(lambda a, b: np.array_equal(a, np.asarray(b)), ref, state.frozen["reference"])
    assert all(jax.tree.leaves(same))


def test_evaluate_per_task_size():
    params = init_params(CFG, jax.random.key(0))
    engine = SwarmRollout(greedy(RolloutConfig(env=ENV)), CFG)
    out = evaluate(engine, params, params, sample_eval_tasks(jax.random.key(1), ENV, [1, 4], 8), jax.random.key(0))
    assert set(out) == {1, 4}
    for row in out.values():
        assert set(row) == {"item_f1", "critical_steps", "total_steps", "subagents", "finished_subagents",
                            "no_spawn_fraction", "answered"}
        assert 0.0 <= row["finished_subagents"] <= row["subagents"]
        assert 0.0 <= row["item_f1"] <= 1.0 and 0.0 <= row["no_spawn_fraction"] <= 1.0


def test_bad_parl_config():
    with pytest.raises(ValueError, match="divisible"):
        PARLTrainConfig(tasks_per_step=3, group_size=3)
    with pytest.raises(ValueError, match="advantage"):
        PARLTrainConfig(advantage="ppo")


