"""`swarmjax train --config examples/ledger/config.py --workdir runs/ledger`

The stateful ledger task (ledger_task.py, beside this file) on the CPU default policy: a
BPE trained on the task's corpus and a small random Qwen3, warm-started on the task's
demonstrations, then RL. `--set role=orchestrator` trains an orchestrator whose
sub-agents share the episode's ledger.
"""

from ledger_task import LedgerTask

from swarmjax.optim import OptimConfig
from swarmjax.roles import Roles
from swarmjax.swarm.text_rollout import TextRolloutConfig
from swarmjax.train.agent import TextRLConfig, TextSFTConfig
from swarmjax.train.agent_job import AgentJob


def get_config() -> AgentJob:
    return AgentJob(
        task=LedgerTask(max_value=20), chat="qwen3",
        sft=TextSFTConfig(steps=200, batch=16, demos=1024,
                          optim=OptimConfig(learning_rate=3e-3, warmup_steps=10, decay_steps=200)),
        rl=TextRLConfig(steps=10, tasks_per_step=4, group_size=4,
                        rollout=TextRolloutConfig(contexts=Roles(2048, 768), max_turn_tokens=192,
                                                  subagent_lanes=4, subagent_turns=5)),
        eval_episodes=32, eval_every=5)
