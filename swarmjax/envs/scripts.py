"""Scripted wide-search policies as token sequences: serial work, a k-way split, a
well-behaved worker. Used for demonstrations (warm start), traces, tests and
benchmarks; feed them to :func:`~swarmjax.envs.widesearch.scripted` or the engine's
``Scripts``."""

from __future__ import annotations

import random
from collections.abc import Sequence

from swarmjax.envs.widesearch import Episode, Vocab, WideSearchConfig


def answer(cfg: WideSearchConfig, ep: Episode, entities: Sequence[int] | None = None) -> list[int]:
    """``<answer> e v .. </answer>`` with the true values of ``entities`` (default: the task)."""
    v = Vocab(cfg)
    ents = ep.task if entities is None else entities
    return [v["<answer>"], *(t for e in ents for t in (v.entity(e), v.value(ep.table[e]))), v["</answer>"]]


def serial(cfg: WideSearchConfig, ep: Episode) -> list[int]:
    """The orchestrator looks every entity up itself, then answers: n + 1 critical steps."""
    v = Vocab(cfg)
    return [t for e in ep.task for t in (v["<lookup>"], v.entity(e))] + answer(cfg, ep)


def worker(cfg: WideSearchConfig, ep: Episode, entities: Sequence[int]) -> list[int]:
    """A sub-agent that looks up each of its entities, then returns them."""
    v = Vocab(cfg)
    return ([t for e in entities for t in (v["<lookup>"], v.entity(e))] + [v["<return>"]]
            + [t for e in entities for t in (v.entity(e), v.value(ep.table[e]))] + [v["</return>"]])


def delegate(cfg: WideSearchConfig, ep: Episode, chunks: Sequence[Sequence[int]],
             answer_entities: Sequence[int] | None = None) -> tuple[list[int], list[list[int]]]:
    """Spawn one sub-agent per chunk, wait, answer (``answer_entities``, default the task);
    the orchestrator of a first stage of K chunks does not say the ``<wait>`` (the
    environment does).
    Returns the orchestrator's script and one script per sub-agent (spawn order)."""
    v = Vocab(cfg)
    orch = [t for c in chunks for t in (v["<spawn>"], *(v.entity(e) for e in c), v["</spawn>"])]
    # after the K-th block the environment says <wait> itself
    wait = [v["<wait>"]] if len(chunks) < cfg.max_subagents else []
    return orch + wait + answer(cfg, ep, answer_entities), [worker(cfg, ep, c) for c in chunks]


def chunks(task: Sequence[int], parts: int) -> list[list[int]]:
    """``task`` cut into ``parts`` consecutive chunks whose sizes differ by at most one
    (the larger first; empty ones when ``parts`` > n): concatenated in order, the
    sub-agents' answers are the task's order."""
    size, extra = divmod(len(task), parts)
    starts = [k * size + min(k, extra) for k in range(parts + 1)]
    return [list(task[starts[k]:starts[k + 1]]) for k in range(parts)]


def split(cfg: WideSearchConfig, ep: Episode, parts: int) -> tuple[list[int], list[list[int]]]:
    """:func:`delegate` over ``parts`` consecutive :func:`chunks` of the task, answering
    the whole task; with n = 16 and 8 parts: 1 + 3 + 1 = 5 critical steps."""
    return delegate(cfg, ep, chunks(ep.task, parts))


def random_chunks(ep: Episode, max_chunk: int, max_parts: int, rng: random.Random) -> list[list[int]]:
    """Consecutive chunks of the task list with random sizes in ``1..max_chunk`` that
    cover the whole task in at most ``max_parts`` chunks: each size is drawn uniformly
    from the sizes that still let the remaining chunks cover the rest. (When even
    ``max_chunk``-sized chunks cannot cover the task, the last entities are left out.)"""
    chunks, i, n = [], 0, len(ep.task)
    while i < n and len(chunks) < max_parts:
        rest, slots = n - i, max_parts - len(chunks)
        low = min(max(1, rest - max_chunk * (slots - 1)), max_chunk)
        size = rng.randint(low, min(max_chunk, rest))
        chunks.append(list(ep.task[i:i + size]))
        i += size
    return chunks
