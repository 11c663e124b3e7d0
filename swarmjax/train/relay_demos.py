"""Warm-start demonstrations for the text swarm, played through the host twin.

The token world's recipe (:mod:`swarmjax.train.demos`) in text: orchestrators are
mostly serial (one ``lookup`` per turn, then the answer lines); a ``spawn_fraction``
of the episodes with n > 1 delegate the whole task over random consecutive chunks of
``1..max_chunk`` entities (at most K) in one turn of ``create_subagent`` and
``assign_task`` calls (interleaved: each sub-agent is created right before its
assignment), then answer every pair that came back. Sub-agents look up each
of their entities and answer. Nothing prefers the best split: PARL has to find it.

Every turn is played through :class:`~swarmjax.envs.widesearch_relay.RelayEnv` on the
host (no model): the ids are exactly those a rollout that sampled those turns builds
(the differential tests check the jitted swarm hears the same), and the loss mask marks
the agent's own ids. A demonstration that does not end with every pair right raises.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np

from swarmjax.envs.api import play
from swarmjax.envs.orchestration import ASSIGN, CREATE
from swarmjax.envs.widesearch import Episode
from swarmjax.envs.widesearch_relay import RelayTask
from swarmjax.train.demos import Demos, pack_rows, random_chunks


def delegate_script(task: RelayTask, ep: Episode, chunks: Sequence[Sequence[int]]
                    ) -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
    """One turn that creates ``worker{k}`` and assigns it chunk k, for each chunk in
    turn (``create, assign, create, assign, ...``: each call depends on the one before,
    not on a count decided up front), then the answer (every pair of the task, in task
    order); and the sub-agents' serial scripts."""
    calls = []
    for k, c in enumerate(chunks):
        calls += [(CREATE, {"name": task.agent_names[k]}),
                  (ASSIGN, {"agent": task.agent_names[k],
                            "prompt": "Please find " + " and ".join(task.entity_names[e] for e in c)})]
    orch = [task.turn_ids(calls=calls), task.answer_turn(ep, ep.task)]
    return orch, [task.serial_script(ep, c) for c in chunks]


def play_episode(task: RelayTask, ep: Episode, orch: Sequence[np.ndarray],
                 workers: Sequence[Sequence[np.ndarray]] = ()) -> tuple[tuple, list[tuple], dict]:
    """Play scripted turns (``workers[k]``: the k-th spawned sub-agent's) through the host
    twin: (orchestrator (ids [T], mask [T]), [(ids [W], mask [W]) per sub-agent], reward
    terms of the episode; empty when it did not answer)."""
    played = play(task.orchestrator(ep), ep.task, orch, workers=workers)
    done = played.last is not None and played.last.done
    return (played.ids, played.mask), [(s.ids, s.mask) for s in played.subagents], \
        dict(played.last.rewards) if done else {}


def episode_demo(task: RelayTask, ep: Episode, rng: random.Random, *, spawn_fraction: float, max_chunk: int
                 ) -> tuple[tuple, list[tuple]]:
    """One demonstration (module docstring): the orchestrator's row and its sub-agents'."""
    n = len(ep.task)
    if n > 1 and rng.random() < spawn_fraction:
        orch, workers = delegate_script(task, ep, random_chunks(ep, max_chunk, task.cfg.max_subagents, rng))
    else:
        orch, workers = task.serial_script(ep), []
    o, rows, rewards = play_episode(task, ep, orch, workers)
    if rewards.get("r_perf") != 1.0 or rewards.get("answered") != n:
        raise ValueError(f"a demonstration did not answer all {n} pairs right ({rewards or 'no answer'}): "
                         f"max_chunk {max_chunk} is above what a sub-agent can look up, or the task "
                         f"holds more than max_pairs ({task.max_pairs}) entities")
    return o, rows


def pack(rows: Sequence[tuple[np.ndarray, np.ndarray]], pad: int) -> Demos:
    """Right-padded :class:`Demos` [N, max length] of (ids, mask) rows."""
    return pack_rows(rows, max(len(ids) for ids, _ in rows), pad)


def make_relay_demos(task: RelayTask, count: int, seed: int, *, spawn_fraction: float, max_chunk: int,
                     pad: int, on_episode=None) -> tuple[Demos, Demos]:
    """``count`` episodes of sizes drawn from the task config -> (orchestrator demos
    [count, T], sub-agent demos [M, W]); ``on_episode()`` is called after each (progress)."""
    rng = random.Random(seed)
    orch, work = [], []
    for _ in range(count):
        o, rows = episode_demo(task, Episode.sample(task.cfg, rng), rng, spawn_fraction=spawn_fraction,
                               max_chunk=max_chunk)
        orch.append(o)
        work += rows
        if on_episode is not None:
            on_episode()
    if not work:       # no delegation drawn: one sub-agent's serial demonstration
        ep = Episode.sample(task.cfg, rng)
        work = play_episode(task, ep, *delegate_script(task, ep, [ep.task[:1]]))[1]
    return pack(orch, pad), pack(work, pad)
