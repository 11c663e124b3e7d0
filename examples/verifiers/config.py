"""`swarmjax train --config examples/verifiers/config.py --workdir runs/verifiers`

A verifiers environment (vf_calc/: arithmetic with an MCP calculator, a rubric) trained
with RL: each episode is verifiers' own chat program, run by verifiers against the job's
OpenAI-compatible server, so every turn is sampled by the policy and recorded as ids;
verifiers runs the tools and scores the trace. Needs `pip install verifiers`.
"""

import os

from swarmjax.envs.verifiers import VerifiersTask
from swarmjax.models.config import ModelConfig
from swarmjax.optim import OptimConfig
from swarmjax.rl.losses import loss_preset
from swarmjax.rl.update import UpdateConfig
from swarmjax.roles import Roles
from swarmjax.swarm.text_rollout import TextRolloutConfig
from swarmjax.train.agent import TextRLConfig
from swarmjax.train.agent_job import AgentJob

HERE = os.path.dirname(os.path.abspath(__file__))


def get_config() -> AgentJob:
    return AgentJob(
        task=VerifiersTask(taskset="vf_calc:CalcConfig", pythonpath=(HERE,), max_turns=4, timeout_s=120.0,
                           splits={"train": "16:", "validation": "8:16", "test": "0:8"}),
        chat="qwen3", tokenizer_vocab=384, sft=None,
        model=ModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=32,
                          intermediate_size=192),
        rl=TextRLConfig(steps=10, tasks_per_step=2, group_size=4,
                        update=UpdateConfig(loss=loss_preset("gspo"), num_minibatches=2,
                                            optim=OptimConfig(learning_rate=1e-3, decay_steps=20)),
                        rollout=TextRolloutConfig(contexts=Roles(512, 64), max_turn_tokens=24,
                                                  subagent_lanes=1, subagent_turns=1, env_threads=8)),
        eval_episodes=8, eval_every=5, seed=0)
