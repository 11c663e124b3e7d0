"""`swarmjax train --config configs/synth_tools_cpu.py --workdir runs/synth`: tool use across generated environments.

Twelve generated domains (two entity kinds each, a category and a measure per kind;
tools ``get``, ``find``, ``total``, ``update``: ten an environment), their tool graph's
Louvain communities as environments, a third of them held out: the held-out
environments' tools appear in no training task (`swarmjax.envs.synth`). Tasks come from
random walks and shortest paths of up to three calls, a fifth of them writes (scored by the
final state); a task has one or two independent parts (questions), so an orchestrator can
hand each to a sub-agent.

A 1M-parameter Qwen3 with a BPE trained on the training environments' text is
warm-started on demonstrations of both roles (the recorded calls, one a turn; the
orchestrator's hand multi-part tasks to one sub-agent a part), then GSPO as a single
agent, reward the outcome score (answers by item-F1 or exactly, writes also by the final
state). The job's evaluations use the held-out environments (validation and test splits);
`experiments/synth.py` adds the seen environments' `seen` split and the orchestrator arm.
"""

from swarmjax.envs.synth.task import SynthToolTask
from swarmjax.envs.synth.tasks import SynthConfig
from swarmjax.models.config import ModelConfig
from swarmjax.optim import OptimConfig
from swarmjax.rl.losses import loss_preset
from swarmjax.rl.update import UpdateConfig
from swarmjax.swarm.text_rollout import TextRolloutConfig
from swarmjax.train.agent import TextRLConfig, TextSFTConfig
from swarmjax.train.agent_job import AgentJob

TASKS = SynthConfig(domains=12, kinds=(2, 2), categories=(1, 1), measures=(1, 1), ops=("get", "find", "total", "update"),
                    max_calls=3, max_parts=2, tasks=3000, held_out=0.34, write_fraction=0.2, seed=0)
CONTEXT = 2048


def get_config() -> AgentJob:
    return AgentJob(
        task=SynthToolTask(cfg=TASKS), chat="qwen3", tokenizer_vocab=2048, max_subagents=2,
        model=ModelConfig(hidden_size=128, num_layers=3, num_heads=4, num_kv_heads=2, head_dim=32,
                          intermediate_size=384),
        sft=TextSFTConfig(steps=500, batch=8, demos=2048, bucket=256, mix=("orchestrator",),
                          optim=OptimConfig(learning_rate=3e-3, warmup_steps=20, decay_steps=500)),
        rl=TextRLConfig(steps=30, tasks_per_step=4, group_size=8, dynamic_sampling=True, bucket=256,
                        update=UpdateConfig(loss=loss_preset("gspo"), num_minibatches=4,
                                            optim=OptimConfig(learning_rate=2e-4, decay_steps=120)),
                        rollout=TextRolloutConfig(orch_context=CONTEXT, worker_context=CONTEXT, max_turn_tokens=256,
                                                  worker_lanes=2, subagent_turns=4)),
        eval_episodes=64, eval_every=10, seed=0)
