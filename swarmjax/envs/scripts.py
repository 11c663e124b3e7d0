"""Scripted wide-search policies as token sequences: serial work, a k-way split, a
well-behaved worker. Used for demonstrations (warm start), traces, tests and
benchmarks; feed them to :func:`~swarmjax.envs.widesearch.scripted` or the engine's
``Scripts``."""

from __future__ import annotations

from collections.abc import Sequence

from swarmjax.envs.widesearch import Episode, Vocab, WideSearchConfig


def answer(cfg: WideSearchConfig, ep: Episode) -> list[int]:
    """``<answer> e v .. </answer>`` with the true values, in task order."""
    v = Vocab(cfg)
    return [v["<answer>"], *(t for e in ep.task for t in (v.entity(e), v.value(ep.table[e]))), v["</answer>"]]


def serial(cfg: WideSearchConfig, ep: Episode) -> list[int]:
    """The orchestrator looks every entity up itself, then answers: n + 1 critical steps."""
    v = Vocab(cfg)
    return [t for e in ep.task for t in (v["<lookup>"], v.entity(e))] + answer(cfg, ep)


def worker(cfg: WideSearchConfig, ep: Episode, entities: Sequence[int]) -> list[int]:
    """A sub-agent that looks up each of its entities, then returns them."""
    v = Vocab(cfg)
    return ([t for e in entities for t in (v["<lookup>"], v.entity(e))] + [v["<return>"]]
            + [t for e in entities for t in (v.entity(e), v.value(ep.table[e]))] + [v["</return>"]])


def split(cfg: WideSearchConfig, ep: Episode, parts: int) -> tuple[list[int], list[list[int]]]:
    """Spawn ``parts`` sub-agents on round-robin chunks of the task, wait, answer.
    Returns the orchestrator's script and one script per sub-agent (spawn order);
    with n = 16 and 8 parts: 1 + 3 + 1 = 5 critical steps."""
    v = Vocab(cfg)
    chunks = [ep.task[i::parts] for i in range(parts)]
    orch = [t for c in chunks for t in (v["<spawn>"], *(v.entity(e) for e in c), v["</spawn>"])]
    return orch + [v["<wait>"]] + answer(cfg, ep), [worker(cfg, ep, c) for c in chunks]
