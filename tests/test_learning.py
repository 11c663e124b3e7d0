"""Learning regression: a short PARL run from a serial warm start learns to delegate.

A small wide-search (n <= 6, K = 3 sub-agents of <= 2 lookups, budget 5: serial work
needs n + 1 = 7 at n = 6, the best split 5). After SFT the greedy orchestrator is serial,
so under the budget it cannot finish a 6-entity task. After a short PARL run, on held-out
6-entity tasks under the same budget, it spawns sub-agents and its item-F1 is higher.
One seed here (init, demonstrations, rollouts and evaluation tasks all follow it); the
token world's learning results over several seeds are measured outside the suite
(docs/results.md).

The run goes in a subprocess with XLA's backend optimisations on: the suite turns them off
to compile faster (tests/conftest.py), and this test's time is in running its 460 steps
(standalone on the 2-core machine: 86 s with them off, 65 s on).
"""

import dataclasses
import json
import os
import subprocess
import sys

import jax
import pytest

from swarmjax.envs.widesearch import Vocab, WideSearchConfig
from swarmjax.models import ModelConfig, init_params
from swarmjax.optim import OptimConfig
from swarmjax.rl.losses import loss_preset
from swarmjax.rl.parl import PARLConfig
from swarmjax.rl.update import UpdateConfig
from swarmjax.roles import Roles
from swarmjax.swarm.engine import RolloutConfig, SwarmRollout
from swarmjax.train.agent_eval import evaluate, mean_figures
from swarmjax.train.parl import PARLTrainConfig, PARLTrainer, greedy, sample_eval_tasks
from swarmjax.train.sft import SFTConfig, train_sft

pytestmark = pytest.mark.slow     # the whole file: end-to-end runs (the README's whole suite)

ENV = WideSearchConfig(num_entities=16, num_values=16, min_task_size=1, max_task_size=6, max_subagents=3,
                       subagent_steps=4, budget=5, contexts=Roles(64, 24))
CFG = ModelConfig(vocab_size=Vocab(ENV).size, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                  head_dim=16, intermediate_size=192)


def learn(seed: int) -> dict:
    """The warm start and the PARL run: the warm start's report, greedy n = 6 figures before and after."""
    assert ENV.min_critical_steps(6) == 5 < ENV.serial_critical_steps(6)
    sft = SFTConfig(steps=400, batch=32, demos=12800, eval_demos=64, spawn_fraction=0.3, seed=seed,
                    optim=OptimConfig(learning_rate=3e-3, warmup_steps=20, decay_steps=400))
    key = jax.random.key(seed)
    warm, report = train_sft(init_params(CFG, jax.random.fold_in(key, 0)), CFG,
                             dataclasses.replace(ENV, budget=None), sft)

    cfg = PARLTrainConfig(rollout=RolloutConfig(env=ENV), parl=PARLConfig(lambda1=0.3, lambda2=0.3,
                                                                         anneal_steps=40, parallel_target=3),
                          tasks_per_step=8, group_size=8,
                          update=UpdateConfig(loss=loss_preset("gspo"), num_minibatches=4,
                                              optim=OptimConfig(learning_rate=3e-4)))
    trainer = PARLTrainer(CFG, cfg)
    state = trainer.init(Roles.both(warm))
    for i in range(60):
        state, _ = trainer.step(state, jax.random.fold_in(jax.random.fold_in(key, 1), i), step=i)

    # greedy under the training budget
    engine = dataclasses.replace(trainer.engine, greedy_rollout=SwarmRollout(greedy(cfg.rollout, budget=ENV.budget),
                                                                             CFG), batch=64)
    tasks = sample_eval_tasks(jax.random.fold_in(key, 2), ENV, [6], 64)
    before = mean_figures(evaluate(engine, Roles.both(warm), tasks, jax.random.fold_in(key, 3)))
    after = mean_figures(evaluate(engine, Roles(state.params, warm), tasks, jax.random.fold_in(key, 3)))
    return {"warm_start": report["after"], "before": before, "after": after}


def test_short_parl_run_learns_to_delegate(seed=0):
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
             if not f.startswith(("--xla_backend_optimization_level", "--xla_force_host_platform_device_count"))]
    run = subprocess.run([sys.executable, os.path.abspath(__file__), str(seed)], capture_output=True, text=True,
                         env={**os.environ, "XLA_FLAGS": " ".join(flags)}, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.splitlines()[-1])
    warm, before, after = out["warm_start"], out["before"], out["after"]
    assert warm["worker_acc"] > 0.95 and warm["orch_acc"] > 0.8, warm
    assert before["subagents"] < 0.5 and after["subagents"] > before["subagents"] + 1.0, (before, after)
    assert after["accuracy"] > before["accuracy"] + 0.1, (before, after)          # item-F1


if __name__ == "__main__":
    print(json.dumps(jax.tree.map(float, learn(int(sys.argv[1])))))
