"""The token world as a task of the one job: ``task=WideSearchTokens(...)`` (or the
built-in name ``"widesearch-tokens"``) with ``engine="token"``.

The task holds the world's rules (``cfg``: :class:`~swarmjax.envs.widesearch.WideSearchConfig`),
its task set (TFDS builder ``swarmjax.data.builder``, read with grain: :class:`TaskSetConfig`)
and the task sizes its held-out problems come in. A problem is one task record
``{"table" [E], "entities" [N_max], "n" []}`` (host int32:
:func:`~swarmjax.envs.widesearch_jax.problems`). What it gives the job
(the task protocol, :mod:`swarmjax.envs.task`):

* :meth:`WideSearchTokens.prepare`: the task set built (or found) under the workdir,
  the task bound to it;
* :meth:`WideSearchTokens.stream`: the train split's records, shuffled with the seed
  (a share drawn from the large tasks with ``data.focus_fraction``), as a checkpointable
  stream (:class:`TaskSetStream`: its state is the grain iterator's); every process
  reads the whole stream (the token engine rolls a step out as one global batch);
* :meth:`WideSearchTokens.held_out`: the first problems of each size in
  :attr:`~WideSearchTokens.eval_sizes` of a held-out split, size by size;
* ``env(problem, ctx)``: the host form (:class:`~swarmjax.envs.widesearch_tokens.WideSearchTokenEnv`);
* ``size(problem)``: the task's n.

Its warm start is the reference simulator's demonstrations (:class:`~swarmjax.train.sft.SFTConfig`),
its engine the jitted token swarm (:class:`~swarmjax.train.engines.TokenEngine`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from swarmjax.envs import widesearch_jax as wsj
from swarmjax.envs.task import TaskError
from swarmjax.envs.widesearch import Episode, WideSearchConfig

__all__ = ["TaskSetConfig", "TaskSetStream", "WideSearchTokens", "episode", "eval_tasks"]


@dataclasses.dataclass(frozen=True)
class TaskSetConfig:
    """The task set (TFDS builder ``swarmjax.data.builder``, read with grain)."""

    data_dir: str | None = None    # None: <workdir>/data
    train_size: int = 20000        # RL draws its tasks from here (shuffled, repeated)
    validation_size: int = 2048    # periodic evaluations (first tasks of each size n); best checkpoint
    test_size: int = 2048          # the summary's start vs final comparison
    seed: int = 0                  # generation seed of the task set (splits use disjoint streams)
    # oversampling of large tasks: this fraction of the train stream comes from the tasks
    # with n >= focus_min_n (the rest from all of them); held-out problems stay uniform
    focus_fraction: float = 0.0
    focus_min_n: int | None = None

    def __post_init__(self):
        if min(self.train_size, self.validation_size, self.test_size) < 1:
            raise ValueError("task.data.train_size, validation_size and test_size must be >= 1")
        if not 0.0 <= self.focus_fraction < 1.0:
            raise ValueError(f"task.data.focus_fraction must be in [0, 1), got {self.focus_fraction}")
        if self.focus_fraction > 0 and self.focus_min_n is None:
            raise ValueError("task.data.focus_fraction > 0 needs task.data.focus_min_n")


_SOURCES: dict[Any, dict[str, Any]] = {}          # a prepared task -> its task set's sources


@dataclasses.dataclass(frozen=True)
class WideSearchTokens:
    """The token world's task (module docstring).

    cfg: the rules: entities, values, task sizes, sub-agents, contexts, budget.
    data: the task set.
    eval_sizes: the held-out problems' sizes; a job's ``eval_episodes`` are shared
      equally among them (the first of each size in the split). Not part of the task's
      identity (repr, equality): a checkpoint may be evaluated on other sizes.
    """

    cfg: WideSearchConfig = WideSearchConfig()
    data: TaskSetConfig = TaskSetConfig()
    # which held-out problems to evaluate, not what the task is: out of its repr and equality
    # (a run's identity), so a checkpoint may be evaluated on other sizes
    eval_sizes: tuple[int, ...] = dataclasses.field(default=(1, 4, 8, 16), repr=False, compare=False)

    def __post_init__(self):
        env = self.cfg
        bad = [n for n in self.eval_sizes if not env.min_task_size <= n <= env.max_task_size]
        if bad or not self.eval_sizes:
            raise ValueError(f"task.eval_sizes {list(self.eval_sizes)} must be non-empty and within the task "
                             f"sizes {env.min_task_size}..{env.max_task_size}")
        if env.budget is not None:
            need = env.min_critical_steps(env.max_task_size)
            if env.budget < need:
                raise ValueError(f"task.cfg.budget {env.budget} is below {need}, the fewest critical steps any "
                                 f"policy needs for a task of size {env.max_task_size} (K = {env.max_subagents} "
                                 f"sub-agents of at most {env.worker_capacity} lookups)")
        focus = self.data.focus_min_n
        if self.data.focus_fraction > 0 and not env.min_task_size <= focus <= env.max_task_size:
            raise ValueError(f"task.data.focus_min_n {focus} is outside the task sizes "
                             f"{env.min_task_size}..{env.max_task_size}")

    # -- the task protocol -------------------------------------------------------------

    def prepare(self, workdir: str, *, progress: bool = False) -> "WideSearchTokens":
        """The task set built under ``data.data_dir`` (None: ``<workdir>/data``; reused when
        there), and the task with that directory: call on one process first
        (:func:`~swarmjax.train.distributed.primary_first`)."""
        from etils import epath

        data_dir = self.data.data_dir or str(epath.Path(workdir) / "data")
        if not progress:
            import tensorflow_datasets as tfds
            tfds.disable_progress_bar()
        bound = dataclasses.replace(self, data=dataclasses.replace(self.data, data_dir=data_dir))
        bound.sources()
        return bound

    def sources(self) -> dict[str, Any]:
        """``{split: TFDS data source}`` of the prepared task set (:func:`swarmjax.data.prepare`;
        opened once per task)."""
        from swarmjax.data import prepare

        d = self.data
        if d.data_dir is None:
            raise TaskError("the token task set has no data_dir: call task.prepare(workdir) first")
        if self not in _SOURCES:
            _SOURCES[self] = prepare(env=self.cfg, data_dir=d.data_dir, train_size=d.train_size,
                                     validation_size=d.validation_size, test_size=d.test_size, seed=d.seed)
        return _SOURCES[self]

    def stream(self, split: str, seed: int) -> "TaskSetStream":
        """The train split's stream (module docstring); held-out splits: :meth:`held_out`."""
        from swarmjax.data import task_iterator

        if split != "train":
            raise ValueError(f"the token task streams its train split; {split!r} is held out (held_out)")
        d = self.data
        return TaskSetStream(task_iterator(self.sources()["train"], 1, seed=seed, env=self.cfg, process_index=0,
                                           process_count=1, focus_min_n=d.focus_min_n,
                                           focus_fraction=d.focus_fraction))

    def held_out(self, split: str, seed: int, count: int) -> list[dict[str, np.ndarray]]:
        """The first ``count / len(eval_sizes)`` problems of each size of ``split``, size by
        size (:func:`eval_tasks`; the task set's own seed orders them, not ``seed``)."""
        per, extra = divmod(count, len(self.eval_sizes))
        if extra or not per:
            raise ValueError(f"eval_episodes {count} must be a multiple of the {len(self.eval_sizes)} "
                             f"task.eval_sizes {list(self.eval_sizes)}")
        return eval_tasks(self.sources()[split], self.eval_sizes, per, split)

    def env(self, problem: dict, ctx: Any = None):
        """The host form over ``problem`` (:class:`~swarmjax.envs.widesearch_tokens.WideSearchTokenEnv`;
        its ``reset`` takes the problem)."""
        from swarmjax.envs.widesearch_tokens import WideSearchTokenEnv

        return WideSearchTokenEnv(self.cfg)

    def size(self, problem: dict) -> int:
        return int(problem["n"])


def episode(problem: dict) -> Episode:
    """A problem record as the reference simulator's :class:`~swarmjax.envs.widesearch.Episode`."""
    return Episode(table=np.asarray(problem["table"]).tolist(),
                   task=np.asarray(problem["entities"])[:int(problem["n"])].tolist())


class TaskSetStream:
    """The train split's grain iterator (one record a batch) as a task stream
    (:mod:`swarmjax.train.streams`): ``take(count)`` the next ``count`` problems,
    ``ids(count)`` their task ids; the state is the iterator's."""

    def __init__(self, iterator):
        self.iterator = iterator
        self.ahead: list[tuple[dict, str]] = []       # records read by ids(), not taken yet

    def _read(self, count: int) -> list[tuple[dict, str]]:
        from swarmjax.data import to_tasks

        while len(self.ahead) < count:
            rec = next(self.iterator)
            self.ahead.append((wsj.problems(to_tasks(rec))[0], bytes(np.asarray(rec["task_id"])[0]).decode()))
        return self.ahead[:count]

    def take(self, count: int) -> list[dict[str, np.ndarray]]:
        out = [p for p, _ in self._read(count)]
        del self.ahead[:count]
        return out

    def ids(self, count: int) -> list[str]:
        return [i for _, i in self._read(count)]

    def state(self) -> dict:
        if self.ahead:
            raise RuntimeError("a stream read ahead (ids) cannot checkpoint before take")
        return self.iterator.get_state()

    def restore(self, state: dict) -> None:
        self.ahead = []
        self.iterator.set_state(state)


def eval_tasks(source, sizes: tuple[int, ...], episodes: int, split: str = "test") -> list[dict[str, np.ndarray]]:
    """The first ``episodes`` tasks of each size n in ``sizes`` from a data source of task
    records (a held-out split), size by size: a problem list
    (:func:`~swarmjax.envs.widesearch_jax.problems`). Raises ValueError if a size is short."""
    picked: dict[int, list[dict]] = {n: [] for n in sizes}
    for i in range(len(source)):
        rec = source[i]
        n = int(rec["n"])
        if n in picked and len(picked[n]) < episodes:
            picked[n].append(rec)
            if all(len(v) == episodes for v in picked.values()):
                break
    out = []
    for n, recs in picked.items():
        if len(recs) < episodes:
            raise ValueError(f"the {split} split has {len(recs)} tasks of size {n}, {episodes} are evaluated: "
                             f"raise task.data.{split}_size")
        out += [{k: np.asarray(r[k], np.int32) for k in ("table", "entities", "n")} for r in recs]
    return out
