"""`swarmjax train --config examples/harness/config.py --workdir runs/harness`

Trains an existing agent harness (agent.py: a loop over the `openai` client with its own
tool) without changing it: each episode runs `solve` in a thread against the job's
OpenAI-compatible server, which samples every turn with the policy and records the exact
ids. The warm start plays the teacher's demonstrations (lookup_data.py: half of them guess
instead of looking up) through the harness; RL (GSPO) then rewards the right value.
Needs `pip install swarmjax[serve]` (aiohttp, openai).
"""

from swarmjax.envs.harness import HarnessTask
from swarmjax.models.config import ModelConfig
from swarmjax.optim import OptimConfig
from swarmjax.rl.losses import loss_preset
from swarmjax.rl.update import UpdateConfig
from swarmjax.roles import Roles
from swarmjax.swarm.text_rollout import TextRolloutConfig
from swarmjax.train.agent import TextRLConfig, TextSFTConfig
from swarmjax.train.agent_job import AgentJob


def get_config() -> AgentJob:
    return AgentJob(
        task=HarnessTask(run="agent:solve", verify="lookup_data:score", problems="lookup_data:problems",
                         teacher="lookup_data:teacher", model="policy", timeout_s=120.0),
        chat="qwen3", tokenizer_vocab=512,
        model=ModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=32,
                          intermediate_size=192),
        sft=TextSFTConfig(steps=1200, batch=16, demos=1024,
                          optim=OptimConfig(learning_rate=3e-3, warmup_steps=20, decay_steps=1200)),
        rl=TextRLConfig(steps=30, tasks_per_step=4, group_size=8, dynamic_sampling=True,
                        update=UpdateConfig(loss=loss_preset("gspo"), num_minibatches=2,
                                            optim=OptimConfig(learning_rate=3e-4, decay_steps=60)),
                        # a thread per episode of a step: each waits on its harness's next request
                        rollout=TextRolloutConfig(contexts=Roles(512, 64), max_turn_tokens=48,
                                                  subagent_lanes=1, subagent_turns=1, env_threads=32)),
        eval_episodes=64, eval_every=10, seed=0)
