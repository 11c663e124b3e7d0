"""`swarmjax train --config configs/parl_widesearch_cpu.py --workdir runs/cpu`: the CPU default.

Wide-search with n up to 16 and up to 8 sub-agents of <= 2 lookups (worker context 24
fits two), critical-step budget 8 (serial work at n = 16 needs 17; the best split 5),
a 0.1M-parameter Qwen3 trained for both roles by the warm start, then PARL with GSPO.
PARL channels (our closed forms, see swarmjax/rl/parl.py): r_parallel = min(spawned, 8) / 8,
r_finish = returned / spawned, both annealed linearly to 0; step cost 0.005.
"""

from swarmjax.envs.widesearch import Vocab, WideSearchConfig
from swarmjax.models.config import ModelConfig
from swarmjax.optim import OptimConfig
from swarmjax.rl.losses import loss_preset
from swarmjax.rl.parl import PARLConfig
from swarmjax.rl.update import UpdateConfig
from swarmjax.swarm.engine import RolloutConfig
from swarmjax.train.job import TrainJob
from swarmjax.train.parl import PARLTrainConfig
from swarmjax.train.sft import SFTConfig

ENV = WideSearchConfig(num_entities=32, num_values=32, min_task_size=1, max_task_size=16, max_subagents=8,
                       subagent_steps=4, budget=8, orch_context=160, worker_context=24)


def get_config() -> TrainJob:
    return TrainJob(
        model=ModelConfig(vocab_size=Vocab(ENV).size, hidden_size=64, num_layers=2, num_heads=4,
                          num_kv_heads=2, head_dim=16, intermediate_size=192),
        sft=SFTConfig(steps=500, batch=16, demos=2048, spawn_fraction=0.25,
                      optim=OptimConfig(learning_rate=3e-3, warmup_steps=20, decay_steps=500)),
        parl=PARLTrainConfig(
            rollout=RolloutConfig(env=ENV), parl=PARLConfig(lambda1=0.3, lambda2=0.3, anneal_steps=150),
            tasks_per_step=8, group_size=8,
            update=UpdateConfig(loss=loss_preset("gspo"), num_minibatches=4, optim=OptimConfig(learning_rate=3e-4))),
        parl_steps=200, eval_sizes=(1, 4, 8, 16), eval_episodes=32, eval_every=50, seed=0)
