"""`swarmjax train --config configs/synth_tools_cpu.py --workdir runs/synth`: tool use across generated environments.

Twelve generated domains (one entity kind each, with a category and a measure; tools
``get``, ``find``, ``total`` and two ``update``: five an environment), their tool graph's
Louvain communities as environments, a third of them held out: the held-out
environments' tools appear in no training task (`swarmjax.envs.synth`). Tasks come from
random walks and shortest paths of up to three calls, a fifth of them writes (scored by
the final state as well); a task has one or two independent parts (questions).

A 1M-parameter Qwen3 with a BPE trained on the training environments' text is
warm-started on demonstrations (the recorded calls, one a turn, then the answer; user
and tool ids out of the loss), then GSPO as a single agent, reward the outcome score.
The job's evaluations use the held-out environments (validation and test splits);
`experiments/synth.py` adds the seen environments' `seen` split. The prompts are long for
a CPU (the tool schemas: ~870 ids in a training environment, ~1070 in a held-out one,
whose names the BPE has not seen): the warm start takes ~2 s a step on 2 cores.
`--set role=orchestrator --set rl.rollout.max_turn_tokens=256` trains the orchestrator instead (a
multi-part task's demonstration hands each part to a sub-agent).
"""

from swarmjax.envs.synth.task import SynthToolTask
from swarmjax.envs.synth.generator import SynthConfig
from swarmjax.models.config import ModelConfig
from swarmjax.optim import OptimConfig
from swarmjax.rl.losses import loss_preset
from swarmjax.rl.update import UpdateConfig
from swarmjax.roles import Roles
from swarmjax.swarm.text_rollout import TextRolloutConfig
from swarmjax.train.agent import TextRLConfig, TextSFTConfig
from swarmjax.train.agent_job import AgentJob

TASKS = SynthConfig(domains=12, kinds=(1, 1), categories=(1, 1), measures=(1, 1), ops=("get", "find", "total", "update"),
                    max_calls=3, max_parts=2, tasks=3000, held_out=0.34, write_fraction=0.2, min_tools=4, seed=0)
CONTEXT = 1536


def get_config() -> AgentJob:
    return AgentJob(
        task=SynthToolTask(cfg=TASKS), chat="qwen3", tokenizer_vocab=2048, max_subagents=2,
        model=ModelConfig(hidden_size=128, num_layers=3, num_heads=4, num_kv_heads=2, head_dim=32,
                          intermediate_size=384),
        sft=TextSFTConfig(steps=300, batch=8, demos=2048, bucket=128,
                          optim=OptimConfig(learning_rate=3e-3, warmup_steps=20, decay_steps=300)),
        rl=TextRLConfig(steps=20, tasks_per_step=4, group_size=8, dynamic_sampling=True, bucket=128,
                        update=UpdateConfig(loss=loss_preset("gspo"), num_minibatches=4,
                                            optim=OptimConfig(learning_rate=2e-4, decay_steps=80)),
                        rollout=TextRolloutConfig(contexts=Roles(CONTEXT, CONTEXT), max_turn_tokens=128,
                                                  subagent_lanes=2, subagent_turns=4)),
        eval_episodes=64, eval_every=10, seed=0)
