"""`swarmjax train --config configs/parl_widesearch_cpu.py --workdir runs/cpu`: the CPU default.

Wide-search with n up to 16 and up to 8 sub-agents of <= 2 lookups (worker context 24
fits two), critical-step budget 8 (serial work at n = 16 needs 17; the best split 5),
a 0.6M-parameter Qwen3 trained for both roles by the warm start (2000 steps on 32k
fresh demonstrations, 30% of them delegating the whole task over random chunks of 1-2
entities and answering what came back; greedy decoding of the result is serial),
then 300 PARL steps with GSPO and Muon, half of each batch drawn from the tasks with
n >= 12 (the only ones where the 7th and 8th sub-agent matter).
PARL channels (our closed forms, see swarmjax/rl/parl.py): r_parallel = "parallel", the
asked-for entities sub-agents returned beside each stage's busiest sub-agent / 16 (the
work taken off the critical path: 0 for any delegation of a one-entity task, 14/16 for
8 sub-agents x 2 entities, 12/16 for 7), weight 0.3; r_finish = returned / spawned (1
when none), weight 0.3; both annealed linearly to 0 over 200 PARL steps; cost 0.005 per
step of any agent plus 0.004 per critical step. Without the latter the annealed reward
ranks "7 sub-agents + 2 own lookups" (25 total steps, 7 critical) above "8 sub-agents"
(26, 5): the K - 1 optimum. With 0.01 per critical step (tried, seeds 0-1) the 8th
sub-agent won, but 4 one-entity sub-agents became the optimum at n = 4, and the policy
carried one-entity blocks to n = 16 and dropped entities there (item-F1 0.925, 0.927);
at 0.004 serial work stays the optimum up to n = 7 and two entities per sub-agent at
n = 8 and 16. tests/test_parl_shaping.py checks over the whole schedule that a
one-entity task never profits from delegating and that the 8th sub-agent always pays.

Delegated chunks are at most 2 entities (sft.max_chunk = 2, a worker's capacity): with
chunks of up to 3 (tried, seeds 0-3), a three-entity chunk comes back short, so a
warm-start orchestrator almost never answered 15-16 pairs copied from sub-agent results,
and PARL learned to drop the last entities rather than answer them: 2 of 4 seeds ended
at 7 sub-agents (item-F1 0.889, 0.919), and even the 8-sub-agent seeds gave their 8th
sub-agent one entity (F1 0.962-0.966). Forcing the 16th entity into that policy's spawn
turn lowered its F1 from 0.966 to 0.903 (16 tasks): its answer could not copy a 16th
pair. With chunks of 1-2 every delegated entity comes back; at n = 16 the only cover by
8 chunks is 8 x 2, at smaller n the chunkings stay random.
"""

from swarmjax.envs.widesearch import Vocab, WideSearchConfig
from swarmjax.envs.widesearch_token_task import TaskSetConfig, WideSearchTokens
from swarmjax.models.config import ModelConfig
from swarmjax.optim import OptimConfig
from swarmjax.rl.losses import loss_preset
from swarmjax.rl.parl import PARLConfig
from swarmjax.rl.update import UpdateConfig
from swarmjax.roles import Roles
from swarmjax.train.agent_job import AgentJob
from swarmjax.train.frame import CheckpointConfig
from swarmjax.train.parl import PARLTrainConfig
from swarmjax.train.sft import SFTConfig

ENV = WideSearchConfig(num_entities=32, num_values=32, min_task_size=1, max_task_size=16, max_subagents=8,
                       subagent_steps=4, budget=8, contexts=Roles(160, 24))


def get_config() -> AgentJob:
    return AgentJob(
        task=WideSearchTokens(cfg=ENV, data=TaskSetConfig(train_size=20000, test_size=2048, focus_fraction=0.5,
                                                          focus_min_n=12),
                              eval_sizes=(1, 4, 8, 16)),
        engine="token", role="orchestrator",
        model=ModelConfig(vocab_size=Vocab(ENV).size, hidden_size=128, num_layers=3, num_heads=4,
                          num_kv_heads=2, head_dim=32, intermediate_size=384),
        sft=SFTConfig(steps=2000, batch=32, demos=32768, spawn_fraction=0.3, max_chunk=2,
                      optim=OptimConfig(learning_rate=3e-3, warmup_steps=20, decay_steps=2000)),
        rl=PARLTrainConfig(
            steps=300,
            parl=PARLConfig(lambda1=0.3, lambda2=0.3, anneal_steps=200, parallel="parallel", parallel_target=16,
                            step_cost=0.005, critical_cost=0.004),
            tasks_per_step=8, group_size=8, dynamic_sampling=True,
            update=UpdateConfig(loss=loss_preset("gspo"), num_minibatches=4,
                                # cosine to 10% over the run's 300 x 4 updates: at a constant
                                # 3e-4 the n = 16 validation F1 kept swinging by up to 0.1
                                # between evaluations after step 100 (the final one is a draw)
                                optim=OptimConfig(learning_rate=3e-4, decay_steps=1200))),
        checkpoint=CheckpointConfig(every=50, keep_last=2),
        eval_episodes=128, eval_every=50, seed=0)
