"""The text PARL recipe's task: the relay wide-search (:mod:`swarmjax.envs.widesearch_relay`)
with the token world's streams and demonstrations, run by the agent job on the device
engine (``configs/parl_widesearch_text_cpu.py``).

* **Training tasks** (``stream("train", seed)``): a ``focus_fraction`` of them with
  n >= ``focus_min_n`` (PARL learns most where a split pays), the rest over the whole
  range, drawn from ``random.Random("parl-<seed>")``.
* **Held-out tasks** (``stream("validation" | "test", seed)``): ``eval_sizes`` in turn,
  the k-th task of size n from ``random.Random("<validation|eval>-<seed>-<n>-<k>")``, a
  stream of its own per split (tables of E values out of V: 32^32 of them, so no
  training table repeats).
* **Demonstrations** (:meth:`RelayPARLTask.demonstration_set`): mostly serial
  orchestrators; with probability ``split_fraction`` a task of n > 1 is delegated whole
  over random consecutive chunks of 1..``max_chunk`` entities
  (:func:`~swarmjax.envs.scripts.random_chunks`), each sub-agent created right before its
  assignment, the answer every pair in task order; sub-agents run the serial script.
  Nothing prefers the best split: PARL has to find it. Each is played through the host
  twin and must answer every pair right.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

import numpy as np

from swarmjax.envs.api import play
from swarmjax.envs.orchestration import ASSIGN, CREATE
from swarmjax.envs.scripts import random_chunks
from swarmjax.envs.task import Demo, ReplayStream
from swarmjax.envs.widesearch import Episode
from swarmjax.envs.widesearch_relay import RelayTask, RelayWideSearchTask
from swarmjax.text.chat import ChatFormat

__all__ = ["RelayPARLTask", "delegate_script"]

HELD_OUT = {"validation": "validation", "test": "eval"}     # split -> its seed streams' prefix


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


@dataclasses.dataclass(frozen=True)
class RelayPARLTask(RelayWideSearchTask):
    """The relay task with the recipe's streams and demonstrations (module docstring).

    focus_fraction, focus_min_n: the share of training tasks drawn with n >= focus_min_n.
    eval_sizes: the held-out tasks' sizes, in turn (empty: drawn over the whole range).
    split_fraction, max_chunk: the share of n > 1 demonstrations that delegate, and the
      largest chunk a sub-agent gets in them.
    """

    focus_fraction: float = 0.0
    focus_min_n: int = 1
    eval_sizes: tuple[int, ...] = ()

    def __post_init__(self):
        super().__post_init__()
        cfg = self.cfg
        if not 0.0 <= self.focus_fraction <= 1.0:
            raise ValueError(f"focus_fraction must be in [0, 1], got {self.focus_fraction}")
        if self.focus_fraction > 0 and not cfg.min_task_size <= self.focus_min_n <= cfg.max_task_size:
            raise ValueError(f"focus_min_n {self.focus_min_n} is outside the task sizes "
                             f"{cfg.min_task_size}..{cfg.max_task_size}")
        bad = [n for n in self.eval_sizes if not cfg.min_task_size <= n <= cfg.max_task_size]
        if bad:
            raise ValueError(f"eval_sizes {self.eval_sizes}: need sizes in {cfg.min_task_size}..{cfg.max_task_size}")

    def stream(self, split: str, seed: int) -> ReplayStream:
        """``split``'s tasks (module docstring): the focus draw for "train", the held-out
        sizes in turn for "validation" and "test"."""
        if split == "train":
            return ReplayStream(lambda rng, i: self._train_task(rng), f"parl-{seed}")
        if split not in HELD_OUT:
            raise ValueError(f"unknown split {split!r}; known: train, {', '.join(HELD_OUT)}")
        sizes = self.eval_sizes or (None,)

        def held_out(rng, i):
            n = sizes[i % len(sizes)]
            return Episode.sample(self.cfg, random.Random(f"{HELD_OUT[split]}-{seed}-{n}-{i // len(sizes)}"), n)
        return ReplayStream(held_out, f"{split}-{seed}", split)

    def _train_task(self, rng: random.Random) -> Episode:
        n = rng.randint(self.focus_min_n, self.cfg.max_task_size) if rng.random() < self.focus_fraction else None
        return Episode.sample(self.cfg, rng, n)

    def demonstration_set(self, count: int, seed: int, chat: ChatFormat) -> list[tuple[Episode, Demo]]:
        """``count`` tasks and their demonstrations (module docstring), both drawn from
        ``random.Random(seed)``. Raises ValueError when one does not answer every pair right
        (a sub-agent's chunk above what it can look up, or more than ``max_pairs`` entities)."""
        task, rng, out = self.relay(chat), random.Random(seed), []
        for _ in range(count):
            ep = Episode.sample(self.cfg, rng)
            n = len(ep.task)
            if n > 1 and rng.random() < self.split_fraction:
                orch, workers = delegate_script(task, ep, random_chunks(ep, self.max_chunk, self.cfg.max_subagents,
                                                                        rng))
            else:
                orch, workers = task.serial_script(ep), []
            last = play(task.orchestrator(ep), ep.task, orch, workers=workers).last
            rewards = dict(last.rewards) if last is not None and last.done else {}
            if rewards.get("r_perf") != 1.0 or rewards.get("answered") != n:
                raise ValueError(f"a demonstration did not answer all {n} pairs right ({rewards or 'no answer'}): "
                                 f"max_chunk {self.max_chunk} is above what a sub-agent can look up, or the task "
                                 f"holds more than max_pairs ({self.max_pairs}) entities")
            out.append((ep, Demo(orch, workers)))
        return out
