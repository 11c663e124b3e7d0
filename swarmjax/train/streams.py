"""One checkpointable stream of training problems for any task plug-in.

A generator task (``sample``) draws from a ``np.random.Generator`` seeded by the job;
a dataset task (``records``) is read in a seeded shuffled order, epoch after epoch
(every record once per epoch). Either way :meth:`TaskStream.state` is a JSON-able dict
a checkpoint keeps and :meth:`TaskStream.restore` continues from: a resumed job draws
exactly the problems an uninterrupted one does, with nothing skipped or repeated.
A task that draws its problems its own way gives its streams itself (``stream(split,
seed)``, e.g. a :class:`~swarmjax.envs.task.ReplayStream`: its state is the count drawn),
with the same interface: :func:`task_stream` picks.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from swarmjax.envs.task import TaskError, records_of, split_seed


class TaskStream:
    """The ``split`` problems of ``task``, in order, from ``seed``.

    >>> stream = TaskStream(task, "train", seed=0)
    >>> problems = stream.take(8); saved = stream.state()
    >>> stream.restore(saved)        # later, in a resumed job
    """

    def __init__(self, task: Any, split: str, seed: int):
        self.task, self.split = task, split
        self.rng = np.random.default_rng(split_seed(seed, split))
        self.records = records_of(task, split)
        self.epoch, self.position = 0, 0
        self.drawn = 0                            # problems taken so far: the next one's id
        self.shuffled_from: str | None = None     # the generator's state before this epoch's shuffle
        self.order = self._shuffle()

    def _shuffle(self) -> np.ndarray | None:
        if self.records is None:
            return None
        self.shuffled_from = json.dumps(self.rng.bit_generator.state)     # to redo this epoch's order
        return self.rng.permutation(len(self.records))

    def take(self, count: int) -> list[Any]:
        """The next ``count`` problems (a dataset wraps into a fresh shuffled epoch)."""
        self.drawn += count
        if self.records is None:
            return list(self.task.sample(self.rng, count, split=self.split))
        out = []
        while len(out) < count:
            if self.position == len(self.order):
                self.epoch, self.position, self.order = self.epoch + 1, 0, self._shuffle()
            out.append(self.records[int(self.order[self.position])])
            self.position += 1
        return out

    def ids(self, count: int) -> list[str]:
        """The ids of the next ``count`` problems (``"<split>/<index in the stream>"``)."""
        return [f"{self.split}/{self.drawn + i}" for i in range(count)]

    def state(self) -> dict[str, Any]:
        """Where the stream is: the generator's state, the epoch and the position in it,
        the problems drawn so far."""
        return {"rng": json.dumps(self.rng.bit_generator.state), "epoch": self.epoch, "position": self.position,
                "drawn": self.drawn,
                "shuffled_from": self.shuffled_from,
                "records": None if self.records is None else len(self.records)}

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state` (raises ``TaskError`` when the dataset's size changed)."""
        if self.records is not None:
            if state["records"] != len(self.records):
                raise TaskError(f"the checkpoint's stream of {state['records']} records does not match the "
                                f"task's {len(self.records)} {self.split} records")
            self.rng.bit_generator.state = json.loads(state["shuffled_from"])
            self.order = self._shuffle()
        self.rng.bit_generator.state = json.loads(state["rng"])
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self.drawn = int(state.get("drawn", 0))


def task_stream(task: Any, split: str, seed: int) -> Any:
    """The stream of ``split``'s problems from ``seed``: the task's own
    (``task.stream(split, seed)``) when it has one, else a :class:`TaskStream`."""
    own = getattr(task, "stream", None)
    return own(split, seed) if callable(own) else TaskStream(task, split, seed)


def held_out(task: Any, split: str, seed: int, count: int) -> list[Any]:
    """The first ``count`` problems of ``split``: the task's own pick
    (``task.held_out(split, seed, count)``) when it has one, a generator task's stream
    (:func:`task_stream`), a dataset's records in order, not shuffled (all of them when it
    has fewer; the caller reports the count it got)."""
    own = getattr(task, "held_out", None)
    if callable(own):
        return list(own(split, seed, count))
    records = None if callable(getattr(task, "stream", None)) else records_of(task, split)
    if records is None:
        return task_stream(task, split, seed).take(count)
    return [records[i] for i in range(min(count, len(records)))]
