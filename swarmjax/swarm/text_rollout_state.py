"""The host state of a text rollout's episodes and agents, and the result they make
(:mod:`swarmjax.swarm.text_rollout` runs them)."""

from __future__ import annotations

import dataclasses
import threading
from concurrent.futures import Future

import numpy as np

from swarmjax.envs.api import HostEnv
from swarmjax.envs.widesearch_jax import RUNNING
from swarmjax.swarm.text_types import AgentTrace, TextRolloutResult

__all__ = ["Agent", "EpisodeState", "in_thread", "rollout_result"]


def in_thread(fn, *args, **kwargs) -> Future:
    """``fn(*args, **kwargs)`` in a daemon thread of its own (an asynchronous env's call,
    which may wait on a client for as long as it likes without holding up the
    interpreter's exit)."""
    future: Future = Future()

    def run():
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as e:  # noqa: BLE001 - raised where the rollout takes the result
            future.set_exception(e)

    threading.Thread(target=run, name="swarmjax-async", daemon=True).start()
    return future


@dataclasses.dataclass
class Agent:
    """Host state of one agent: its environment, trace, row and pending ids."""

    env: HostEnv
    trace: AgentTrace
    episode: int
    is_orch: bool
    index: int = 0               # spawn order within its episode (sub-agents)
    row: int = -1                # device row (orchestrator b, or a lane)
    pending: np.ndarray | None = None   # ids to append before the next turn
    reset: bool = False
    offset: int = 0              # ids of its conversation held by the shared prefix, not its row
    turning: bool = False        # takes a turn in the next decode
    call_left: int = 0           # tokens it may still sample before the environment hears them
    turn_tokens: int = 0         # tokens sampled in its current turn (offset into a script turn)
    partial: list | None = None  # (ids, logprobs, model_logprobs) of a call cut by segment_exit


@dataclasses.dataclass
class EpisodeState:
    orch: Agent
    critical: int = 0
    total: int = 0
    spawned: int = 0
    finished: int = 0
    end: int = RUNNING
    rewards: dict = dataclasses.field(default_factory=dict)
    stage: list = dataclasses.field(default_factory=list)     # running stage's sub-agents
    subagents: list = dataclasses.field(default_factory=list)
    summarizers: list = dataclasses.field(default_factory=list)   # frozen summarisers' agents
    held: np.ndarray | None = None   # the reply a running frozen summariser's summary replaces

    def add(self, rewards):
        for k, v in rewards.items():
            self.rewards[k] = self.rewards.get(k, 0.0) + float(v)


def rollout_result(eps: list[EpisodeState], stats: dict, *, context: int, pad_id: int) -> TextRolloutResult:
    """The rollout's output (:class:`TextRolloutResult`, C = ``context`` columns) from its
    episodes' host state."""
    B, C = len(eps), context
    out = dict(tokens=np.full((B, C), pad_id, np.int32), loss_mask=np.zeros((B, C), bool),
               logprobs=np.zeros((B, C), np.float32), model_logprobs=np.zeros((B, C), np.float32),
               stage_ids=np.zeros((B, C), np.int32))
    length = np.zeros((B,), np.int32)
    for b, ep in enumerate(eps):
        arr = ep.orch.trace.arrays()
        n = len(arr["ids"])
        length[b] = n
        out["tokens"][b, :n] = arr["ids"]
        out["loss_mask"][b, :n] = arr["sampled"]
        out["logprobs"][b, :n] = arr["logprobs"]
        out["model_logprobs"][b, :n] = arr["model_logprobs"]
        out["stage_ids"][b, :n] = arr["turn"]
    terms = sorted({k for ep in eps for k in ep.rewards})
    count = lambda f: np.asarray([f(ep) for ep in eps], np.int32)
    return TextRolloutResult(
        **out, length=length, orch_steps=count(lambda e: e.orch.trace.steps),
        critical_steps=count(lambda e: e.critical), total_steps=count(lambda e: e.total),
        spawned=count(lambda e: e.spawned), finished=count(lambda e: e.finished),
        end_reason=count(lambda e: e.end),
        rewards={k: np.asarray([ep.rewards.get(k, 0.0) for ep in eps], np.float32) for k in terms},
        answers=[ep.orch.trace.answer for ep in eps], orchestrators=[ep.orch.trace for ep in eps],
        subagents=[[s.trace for s in ep.subagents] for ep in eps], stats=stats,
        summarizers=[[s.trace for s in ep.summarizers] for ep in eps])
