"""`swarmjax train --config configs/context_widesearch.py --workdir runs/context`: wide search
where the binding constraint is the context.

Text wide-search (the built-in ``widesearch`` task) with up to 16 entities, ``lookup``
answering with a page (40 filler words, then ``Value: <value>``, as a browsing tool
returns pages), and every agent limited to 1280 ids. A serial agent spends ~95 ids per
entity (a lookup call and its page) on top of a ~230-id prompt: it runs out of context
past ~11 entities (~1770 ids at n = 16: 1.4x its context). An orchestrator hears only
its sub-agents' answer lines (~25 ids per entity with the assignment and its own answer)
on top of a ~500-id prompt and its delegation turn (~1120 ids at n = 16 with 4 sub-agents
of 4 entities, each sub-agent ~560 ids). With the ``summarize`` tool the demonstrations
summarise every 4 lookups (each segment opens with the task and the pairs found so far:
at most ~920 ids).

This job is the warm start the context experiment (``experiments/context.py``) shares
between its arms: one policy warm-started on three ways of working on the same tasks:
the serial agent (demonstrations longer than its context are left out and counted), the
serial agent with ``summarize``, and the orchestrator that delegates consecutive chunks
of up to 4 entities and answers in the order they come back (sub-agents have 6 turns: a
chunk's lookups, the answer and one spare). A quarter of the problems are needle
questions ("which of these entities has the value X?": one line answers it; the serial
demonstrations search in a random order and stop at it, the orchestrator's delegate the
whole list and answer the one line). A batch is 12% serial rows, 33% rows of the
serial agent with summaries, 30% orchestrator rows and 25% sub-agent rows (``sft.shares``:
each way of working at least the share that drawing rows alike would give it: 10%, 33%
and 14%). RL (2 tasks x 8
rollouts a step) is then a single agent's with the context strategy of
``rl.rollout.context`` (``none`` here; the experiment's arms set ``discard_all`` or
``summary``, past 1024 ids), or the orchestrator's (``--set role=orchestrator``). The warm
start is 1000 steps of 16 rows of one length bucket each (``sft.by_length``: ~12k ids a
step where mixed batches pad to ~18k). Copying entity names from the prompt into the
calls is the skill learnt last: at 600 steps it was learnt on one run (single-agent F1
0.98) and not on another (0.07) of the same seed.
"""

from swarmjax.envs.widesearch import WideSearchConfig
from swarmjax.envs.widesearch_text import WideSearchTask
from swarmjax.models.config import ModelConfig
from swarmjax.optim import OptimConfig
from swarmjax.rl.losses import loss_preset
from swarmjax.rl.update import UpdateConfig
from swarmjax.roles import Roles
from swarmjax.swarm.context import ContextConfig
from swarmjax.swarm.text_rollout import TextRolloutConfig
from swarmjax.train.agent import TextRLConfig, TextSFTConfig
from swarmjax.train.agent_job import AgentJob

CHUNK = 4                    # the demonstrations' largest chunk: n = 16 over the K = 4 sub-agents
ENV = WideSearchConfig(num_entities=24, num_values=24, min_task_size=1, max_task_size=16, max_subagents=4,
                       subagent_steps=CHUNK + 2, budget=None)   # a chunk's lookups, its answer and one spare turn
CONTEXT = 1280               # every agent's context (ids)
THRESHOLD = 1024             # a context strategy acts past this: a summary turn (<= ~110 ids) still fits


def get_config() -> AgentJob:
    return AgentJob(
        task=WideSearchTask(ENV, split_fraction=1.0, max_chunk=CHUNK, summary_every=4, page_words=40,
                            needle_fraction=0.25),
        chat="qwen3", tokenizer_vocab=1024, max_subagents=ENV.max_subagents,
        model=ModelConfig(hidden_size=128, num_layers=3, num_heads=4, num_kv_heads=2, head_dim=32,
                          intermediate_size=384),
        sft=TextSFTConfig(steps=1000, batch=16, demos=1024, bucket=128, mix=("single+summary", "orchestrator"),
                          overlong="skip", by_length=True,
                          shares=(("single", 0.12), ("single+summary", 0.33), ("orchestrator", 0.3), ("subagent", 0.25)),
                          optim=OptimConfig(learning_rate=3e-3, warmup_steps=20, decay_steps=1000)),
        rl=TextRLConfig(steps=0, tasks_per_step=2, group_size=8, dynamic_sampling=True, bucket=128,
                        update=UpdateConfig(loss=loss_preset("gspo"), num_minibatches=4,
                                            optim=OptimConfig(learning_rate=2e-4, decay_steps=40)),
                        rollout=TextRolloutConfig(contexts=Roles(CONTEXT, CONTEXT), max_turn_tokens=320,
                                                  subagent_lanes=32, subagent_turns=ENV.subagent_steps,
                                                  context=ContextConfig("none", threshold=THRESHOLD))),
        eval_episodes=8, eval_every=0, seed=0)
