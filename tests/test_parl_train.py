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
from swarmjax.train.parl import PARLTrainConfig, PARLTrainer, evaluate, greedy

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
    workers = jax.tree.map(np.asarray, state.frozen["workers"])
    state, m = trainer.step(state, jax.random.key(1))
    for k in ("reward", "r_perf", "r_parallel", "r_finish", "cost", "lambda1", "lambda2", "item_f1",
              "critical_steps", "subagents", "learner/loss"):
        assert k in m and np.isfinite(m[k]), k
    assert m["lambda1"] == pytest.approx(trainer.cfg.parl.lambda1)        # step 0: not annealed yet
    assert 1 <= m["critical_steps"] <= ENV.budget
    changed = jax.tree.map(lambda a, b: not np.allclose(a, np.asarray(b)), before, state.params)
    assert any(jax.tree.leaves(changed))
    same = jax.tree.map(lambda a, b: np.array_equal(a, np.asarray(b)), workers, state.frozen["workers"])
    assert all(jax.tree.leaves(same))                                  # sub-agents stay frozen
    state, m2 = trainer.step(state, jax.random.key(2))
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
    batch, reward, _, keep = t._rewards(result, groups, jnp.int32(0))
    assert not bool(jnp.any(keep)) and int(jnp.sum(batch.loss_mask)) == 0
    assert int(jnp.sum(result.loss_mask)) > 0


def test_evaluate_per_task_size():
    params = init_params(CFG, jax.random.key(0))
    engine = SwarmRollout(greedy(RolloutConfig(env=ENV)), CFG)
    out = evaluate(engine, params, params, [1, 4], 8, jax.random.key(0))
    assert set(out) == {1, 4}
    for row in out.values():
        assert set(row) == {"item_f1", "critical_steps", "total_steps", "subagents", "no_spawn_fraction",
                            "answered"}
        assert 0.0 <= row["item_f1"] <= 1.0 and 0.0 <= row["no_spawn_fraction"] <= 1.0


def test_bad_parl_config():
    with pytest.raises(ValueError, match="divisible"):
        PARLTrainConfig(tasks_per_step=3, group_size=3)
    with pytest.raises(ValueError, match="advantage"):
        PARLTrainConfig(advantage="ppo")


def test_train_command_end_to_end(tmp_path, capsys):
    """`swarmjax train` on a tiny job: every output file, a summary per task size."""
    import json
    import os

    from swarmjax.cli import main

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    config = os.path.join(root, "configs", "parl_widesearch_cpu.py")
    small = ["model.hidden_size=32", "model.head_dim=8", "model.intermediate_size=64",
             "sft.steps=8", "sft.demos=64", "sft.eval_demos=16", "parl_steps=2", "parl.tasks_per_step=2",
             "parl.group_size=4", "parl.update.num_minibatches=2", "eval_sizes=(1, 16)", "eval_episodes=4",
             "traces_per_eval=1"]
    args = ["train", "--config", config, "--workdir", str(tmp_path), "--no-progress"]
    assert main(args + [a for s in small for a in ("--set", s)]) == 0
    for name in ("config.txt", "metrics.jsonl", "eval.jsonl", "traces.jsonl", "summary.json", "summary.md",
                 "curves.png"):
        assert os.path.getsize(tmp_path / name) > 0, name
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary["warm_start"]) == set(summary["final"]) == {"1", "16"}
    assert set(summary["final"]["16"]) == {"item_f1", "critical_steps", "total_steps", "subagents",
                                           "no_spawn_fraction"}
    steps = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["stage"] for r in steps].count("sft") == 8 and [r["stage"] for r in steps].count("parl") == 2
    assert "| 16 | final |" in capsys.readouterr().out
    # bad overrides are one clear line before anything runs
    assert main(args + ["--set", "parl.update.optim.lr=1"]) == 2
    assert "has no field 'lr'" in capsys.readouterr().err
    assert main(args + ["--set", "eval_sizes=(1, 40)"]) == 2
    assert "outside the task sizes" in capsys.readouterr().err
