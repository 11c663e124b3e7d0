"""`swarmjax train --config configs/context_widesearch.py --workdir runs/context`: wide search
where the binding constraint is the context.

Text wide-search (the built-in ``widesearch`` task) with up to 48 entities, and every agent
limited to 2048 ids. A serial agent spends ~57 ids per entity (a lookup call, its reply)
on top of a ~450-id prompt, so it runs out of context past ~28 entities (~3000 ids at
n = 48: 1.5x its context). An orchestrator spends ~25 ids per entity (the name in an
assignment, the sub-agent's answer line, its own answer line) on top of a ~900-id prompt
and its delegation turn; each of its sub-agents handles a chunk of up to 6 entities in
its own context. With the ``summarize`` tool the demonstrations summarise every 12
lookups (each segment then opens with the task and the pairs found so far).

This job is the warm start the context experiment (``experiments/context.py``) shares
between its arms: one policy warm-started on three ways of working on the same tasks:
the serial agent (demonstrations longer than its context are left out and counted), the
serial agent with ``summarize``, and the orchestrator that delegates. Then RL as a single
agent with the context strategy of ``rl.rollout.context`` (``none`` here; the
experiment's arms set ``discard_all``, ``keep_last_round`` or ``summary``).

It is sized for an accelerator: the warm start's rows are up to 2048 ids. On a 2-core CPU
shrink it (``--set sft.steps=50 --set rl.steps=2``) to try the pipeline, not to learn.
"""

from swarmjax.envs.widesearch import WideSearchConfig
from swarmjax.envs.widesearch_text import WideSearchTask
from swarmjax.models.config import ModelConfig
from swarmjax.optim import OptimConfig
from swarmjax.rl.losses import loss_preset
from swarmjax.rl.update import UpdateConfig
from swarmjax.swarm.context import ContextConfig
from swarmjax.swarm.text_rollout import TextRolloutConfig
from swarmjax.train.agent import TextRLConfig, TextSFTConfig
from swarmjax.train.agent_job import AgentJob

ENV = WideSearchConfig(num_entities=48, num_values=48, min_task_size=1, max_task_size=48, max_subagents=8,
                       subagent_steps=7, budget=None)
CONTEXT = 2048               # every agent's context (ids)
THRESHOLD = 1536             # a context strategy acts past this: a summary (<= ~500 ids) still fits


def get_config() -> AgentJob:
    return AgentJob(
        task=WideSearchTask(ENV, split_fraction=1.0, max_chunk=6, summary_every=12),
        chat="qwen3", tokenizer_vocab=2048, max_subagents=ENV.max_subagents,
        model=ModelConfig(hidden_size=192, num_layers=4, num_heads=6, num_kv_heads=2, head_dim=32,
                          intermediate_size=512),
        sft=TextSFTConfig(steps=1000, batch=16, demos=1024, bucket=256, mix=("single+summary", "orchestrator"),
                          overlong="skip", optim=OptimConfig(learning_rate=3e-3, warmup_steps=20, decay_steps=1000)),
        rl=TextRLConfig(steps=0, tasks_per_step=4, group_size=8, dynamic_sampling=True, bucket=128,
                        update=UpdateConfig(loss=loss_preset("gspo"), num_minibatches=4,
                                            optim=OptimConfig(learning_rate=2e-4, decay_steps=80)),
                        rollout=TextRolloutConfig(orch_context=CONTEXT, worker_context=CONTEXT, max_turn_tokens=768,
                                                  worker_lanes=8, subagent_turns=ENV.subagent_steps,
                                                  context=ContextConfig("none", threshold=THRESHOLD))),
        eval_episodes=16, eval_every=0, seed=0)
