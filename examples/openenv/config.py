"""`swarmjax train --config examples/openenv/config.py --workdir runs/openenv`

An OpenEnv environment (guess_env.py: guess the number, multi-turn) trained with RL from
scratch: the task starts the environment's server as a local process and plays each
episode over its own session; each turn's text is the action, each observation the next
user turn, the environment's rewards the task reward. Needs `pip install openenv-core`.
"""

import os

from swarmjax.envs.openenv import OpenEnvTask
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
        task=OpenEnvTask(app="guess_env:app", pythonpath=(HERE,), problems="guess_env:problems",
                         system="Guess the number. Answer with one number.",
                         corpus_text=tuple(f"{n} is too low. {n} is too high. {n} is correct! No tries left."
                                           for n in range(1, 9))),
        chat="qwen3", tokenizer_vocab=384, sft=None,
        model=ModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=32,
                          intermediate_size=192),
        rl=TextRLConfig(steps=20, tasks_per_step=4, group_size=8,
                        update=UpdateConfig(loss=loss_preset("gspo"), num_minibatches=2,
                                            optim=OptimConfig(learning_rate=1e-3, decay_steps=40)),
                        rollout=TextRolloutConfig(contexts=Roles(256, 64), max_turn_tokens=8,
                                                  subagent_lanes=1, subagent_turns=1, env_threads=8)),
        eval_episodes=32, eval_every=10, seed=0)
