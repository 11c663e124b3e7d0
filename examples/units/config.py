"""`swarmjax train --config examples/units/config.py --workdir runs/units`

The units task (units_task.py, beside this file) on a Hugging Face Qwen3 checkpoint
(make_checkpoint.py writes a tiny one to tiny-qwen3/; point hf_path at your own), as a
single agent; `--set role=orchestrator` trains an orchestrator whose sub-agents are a
frozen copy of the warm-started policy.
"""

import os

from units_task import UnitsTask

from swarmjax.optim import OptimConfig
from swarmjax.rl.update import UpdateConfig
from swarmjax.roles import Roles
from swarmjax.swarm.text_rollout import TextRolloutConfig
from swarmjax.train.agent import TextRLConfig, TextSFTConfig
from swarmjax.train.agent_job import AgentJob


def get_config() -> AgentJob:
    return AgentJob(
        task=UnitsTask(max_value=20),
        hf_path=os.path.join(os.path.dirname(__file__), "tiny-qwen3"),
        sft=TextSFTConfig(steps=60, batch=16, demos=256, optim=OptimConfig(learning_rate=3e-3, warmup_steps=5,
                                                                            decay_steps=60)),
        rl=TextRLConfig(steps=10, tasks_per_step=4, group_size=4,
                        update=UpdateConfig(num_minibatches=2, optim=OptimConfig(learning_rate=1e-4)),
                        rollout=TextRolloutConfig(contexts=Roles(768, 384), max_turn_tokens=128,
                                                  subagent_lanes=16, subagent_turns=3)),
        eval_episodes=16, eval_every=5)
