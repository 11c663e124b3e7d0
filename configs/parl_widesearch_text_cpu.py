"""`swarmjax train --config configs/parl_widesearch_text_cpu.py --workdir runs/text`: PARL in real text.

The token world's headline (configs/parl_widesearch_cpu.py) with multi-token text, run by
the agent job on the device engine: the canonical text wide-search
(swarmjax/envs/widesearch_relay.py: E = V = 32 two-word names, n up to 16, K = 8
sub-agents called worker0..worker7 with 4 turns each, one lookup per turn), the Qwen3
chat format with its tool-call syntax, a byte-level BPE trained here (vocabulary 1000), a
0.72M-parameter Qwen3 for both roles. A serial episode at n = 16 is ~1470 ids (a 572-id
prompt: system text, the three tool schemas, the task; 16 lookup turns of 21 ids and
their responses; the answer lines); the best split is one turn of 8 create_subagent and 8
assign_task calls (~500 sampled ids).

Warm start (the recipe's task, swarmjax/envs/widesearch_relay_parl.py): 1200 steps, each
16 orchestrator and 16 sub-agent conversations (sft.per_role) drawn from 4096 played
demonstrations, half of those with n > 1 delegating the whole task over random chunks of
1-2 entities (the token world's recipe: chunks of 2 are a sub-agent's capacity), each
sub-agent created right before its assignment. PARL: 100 steps of 4 tasks x 8 samples,
half the tasks with n >= 12, on the jitted text swarm (engine="device"); training
rollouts have the token world's critical-step budget of 8 (serial work at n = 16 needs 17
steps, the best split 5), evaluations lift it; the token world's reward (r_parallel
"parallel" with target 16, r_finish, both 0.3 annealed to 0 over 70 steps, cost 0.005 per
step and 0.004 per critical step), GSPO and Muon, the learning rate decayed over 400
updates (100 x 4). The learner runs the ~512 ids every orchestrator row opens with once
per pass (rl.head_multiple). Held-out: 16 tasks of each size 1, 4, 8, 16 per split.
RL-stage seeds over one warm start: ``--set rl_seed=1 --set warm_start_from=<run>``.
What it reached: docs/results.md, "The swarm in text".
"""

from swarmjax.envs.widesearch import WideSearchConfig
from swarmjax.envs.widesearch_relay_parl import RelayPARLTask
from swarmjax.models.config import ModelConfig
from swarmjax.optim import OptimConfig
from swarmjax.rl.losses import loss_preset
from swarmjax.rl.parl import PARLConfig
from swarmjax.rl.update import UpdateConfig
from swarmjax.roles import Roles
from swarmjax.swarm.text_types import SwarmConfig, TextRolloutConfig
from swarmjax.train.agent import TextRLConfig, TextSFTConfig
from swarmjax.train.agent_job import AgentJob

ENV = WideSearchConfig(num_entities=32, num_values=32, min_task_size=1, max_task_size=16, max_subagents=8,
                       subagent_steps=4, budget=None)
EVAL_SIZES = (1, 4, 8, 16)


def get_config() -> AgentJob:
    return AgentJob(
        task=RelayPARLTask(cfg=ENV, split_fraction=0.5, max_chunk=2, max_calls=16, max_mentions=16, max_pairs=16,
                           focus_fraction=0.5, focus_min_n=12, eval_sizes=EVAL_SIZES),
        role="orchestrator", subagents="frozen", engine="device", chat="qwen3", tokenizer_vocab=1000,
        model=ModelConfig(hidden_size=128, num_layers=3, num_heads=4, num_kv_heads=2, head_dim=32,
                          intermediate_size=384),
        sft=TextSFTConfig(steps=1200, batch=16, demos=4096, bucket=128, per_role=True,
                          optim=OptimConfig(learning_rate=3e-3, warmup_steps=20, decay_steps=1200)),
        rl=TextRLConfig(
            steps=100, tasks_per_step=4, group_size=8, dynamic_sampling=True,
            parl=PARLConfig(lambda1=0.3, lambda2=0.3, anneal_steps=70, parallel="parallel", parallel_target=16,
                            step_cost=0.005, critical_cost=0.004),
            update=UpdateConfig(loss=loss_preset("gspo"), num_minibatches=4,
                                optim=OptimConfig(learning_rate=3e-4, decay_steps=400)),
            rollout=TextRolloutConfig(contexts=Roles(2048, 384), max_turn_tokens=640,
                                      subagent_turns=4, budget=8),
            swarm=SwarmConfig(episode_keys=False), bucket=256, head_multiple=64),
        eval_episodes=16 * len(EVAL_SIZES), eval_every=25, seed=0)
