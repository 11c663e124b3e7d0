"""How a task's answer is scored: item-level F1 of a set of answered items against the
true ones (WideSearch's per-item metric; the ``r_perf`` of the wide-search tasks, the
relay and the synthetic environments' state checks), and the delegation counts PARL's
reward reads (:func:`delegation_counts`)."""

from __future__ import annotations

from collections.abc import Iterable

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


def item_f1(correct: Array, answered: Array, truth: Array, has_answer: Array) -> Array:
    """Item-level F1 from counts [B] (or scalars): correct pairs, distinct answered pairs,
    true pairs; 0 without an answer or a correct pair::

        P = correct / max(answered, 1),  R = correct / max(truth, 1),  F1 = 2 P R / (P + R)

    The one implementation for every world: jittable on jax arrays; host numbers and
    numpy arrays stay on the host (a numpy result: ``float(item_f1(...))``)."""
    host = all(isinstance(x, (int, float, bool, np.ndarray, np.generic)) for x in (correct, answered, truth, has_answer))
    xp = np if host else jnp
    precision = correct / xp.maximum(answered, 1)
    recall = correct / xp.maximum(truth, 1)
    f1 = 2 * precision * recall / xp.maximum(precision + recall, 1e-9)
    return xp.where(xp.logical_and(has_answer, xp.greater(correct, 0)), f1, 0.0)


def delegation_counts(asked: Iterable[int], assigned: Iterable[Iterable[int]], returned: Iterable[int]
                      ) -> dict[str, int]:
    """PARL's counts of a host episode's delegation (:mod:`swarmjax.rl.parl`): ``novel``,
    the assignments (entity ids each named, in order) that named an asked-for entity no
    earlier assignment had named; ``returned``, the distinct asked-for entities among
    ``returned`` (the entities the sub-agents' answers carried back)."""
    asked, seen, novel = set(asked), set(), 0
    for ents in assigned:
        ents = set(ents)
        novel += bool((ents & asked) - seen)
        seen |= ents
    return {"novel": novel, "returned": len(asked & set(returned))}
