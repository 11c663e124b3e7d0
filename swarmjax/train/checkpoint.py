"""Orbax checkpoints of a training job: save often and asynchronously, resume exactly,
restore onto any mesh.

What one checkpoint (one step directory ``<directory>/<step>/``) holds, and why:

* ``state/``: the whole :class:`~swarmjax.rl.update.TrainState` pytree: ``step``, the
  trained ``params``, the optax ``opt_state`` (Muon momentum, AdamW moments, counts and
  schedule position: without them a resumed run would restart its optimiser, and Muon's
  momentum and the learning-rate schedule would be off), and the ``frozen`` trees
  (reference model, frozen sub-agents: they are part of what the job trains against and
  need not be re-derived). Written with orbax's ``StandardSave`` (tensorstore/OCDBT),
  each process writing its own shards, so the layout does not depend on the mesh that
  saved it: :meth:`Checkpointer.restore` reads it into whatever shardings the abstract
  state asks for (saved on 1 device, restored onto a 2x2x2 mesh, and back).
* ``meta/``: a JSON dict of everything else the job needs to continue bit for bit: host
  RNG seeds, the data iterator's ``get_state()`` (grain), the loop counters... It is
  copied (JSON round trip) when ``save`` is called, so the job may keep mutating its own
  dict while the checkpoint is written in the background.
* ``metrics/`` (orbax's own item): the eval metrics passed to ``save``, used to keep the
  best checkpoint by ``best_metric``. Every save writes it (when ``best_metric`` is set):
  a checkpoint without a (finite) ``best_metric`` gets the finite metrics it has, maybe
  none, and ranks below every scored one (see :meth:`Checkpointer._tracked_metrics`).
  Orbax warns on each save without metrics once a manager tracks a best metric, so
  "no score" is written rather than left out.

Orbax pieces used: ``CheckpointManager`` with an async checkpointer (the device-to-host
copy happens before ``save`` returns, so the train step may donate the state's buffers
right after; the write to disk and finalisation run in a background thread);
``FixedIntervalPolicy`` (+ ``PreemptionCheckpointingPolicy``, for users running JAX's
preemption service; ``swarmjax train`` takes SIGTERM itself, see
:mod:`swarmjax.train.preemption`, and saves its preemption checkpoint with ``force``)
to decide when to save;
preservation policies ``AnyPreservationPolicy(LatestN(keep_last), BestN(n=1))`` for
retention (orbax deletes the rest after each save is finalised); ``cleanup_tmp_directories``
to remove half-written steps of a killed run.

Half-written checkpoints. On a local/POSIX filesystem orbax 0.12.8 writes a step into
``<step>.orbax-checkpoint-tmp/`` (items into ``<item>.orbax-checkpoint-tmp/`` inside it),
writes ``commit_success.txt`` into it and renames it to ``<step>/`` when done; on GCS it
writes in place and ``commit_success.txt`` is the commit marker. Orbax's default step
listing on POSIX only looks at the directory name, so a bare ``<step>/`` without the
marker (an interrupted copy of a checkpoint, say) would count as complete; we give the
manager orbax's standard step-name format configured with the commit-file check
(``AtomicityMode.COMMIT_FILE`` for *finding* steps; writing still uses the atomic
rename), so a step counts only when it carries the marker. Orbax also lists a step as
soon as its async save *starts*; :meth:`Checkpointer.latest_step` / :meth:`restore`
filter the manager's steps through the same finalisation check, so they never return
a step that is still being written.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import sys
from typing import Any

import jax
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as ocm

__all__ = ["Checkpointer", "abstract_state"]

_STATE, _META = "state", "meta"


def abstract_state(tree: Any, shardings: Any = None) -> Any:
    """The ``abstract_state`` argument of :meth:`Checkpointer.restore`: a pytree of
    ``jax.ShapeDtypeStruct`` with ``.sharding``.

    ``tree``: arrays or ``ShapeDtypeStruct``s (e.g. ``jax.eval_shape(lambda: state)``).
    ``shardings``: a matching pytree of ``jax.sharding.Sharding`` (e.g.
    ``learner.state_shardings(shapes)``), one ``Sharding`` for every leaf, or None to keep
    each leaf's own sharding.
    """
    def one(x, s):
        s = getattr(x, "sharding", None) if s is None else s
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)

    if shardings is None or isinstance(shardings, jax.sharding.Sharding):
        return jax.tree.map(lambda x: one(x, shardings), tree)
    return jax.tree.map(one, tree, shardings)


class Checkpointer:
    """Periodic, asynchronous orbax checkpoints of (TrainState, meta dict, eval metrics).

    >>> ckpt = Checkpointer(workdir + "/checkpoints", save_every=50)
    >>> for step in range(start, num_steps):
    ...     state, _ = learner.update(state, batch)
    ...     ckpt.save(step, state, {"seed": seed, "data": it.get_state()},
    ...               metrics=eval_metrics if step % eval_every == 0 else None)
    >>> ckpt.save(num_steps, state, meta, force=True); ckpt.close()

    Retention: the last ``keep_last`` finalised checkpoints plus the best one by
    ``best_metric`` (``best_mode`` "max" or "min"). A checkpoint saved without metrics,
    or whose metrics lack ``best_metric`` or have it non-finite, never counts as best.
    ``best_metric=None`` keeps only the last ``keep_last``.

    Saves happen at multiples of ``save_every``, on ``force``, and at a JAX preemption
    sync point (orbax's ``PreemptionCheckpointingPolicy``). One Checkpointer per directory
    and job: on creation it deletes half-written steps it finds there.
    """

    def __init__(self, directory: str | os.PathLike, *, save_every: int, keep_last: int = 3,
                 best_metric: str | None = "item_f1", best_mode: str = "max",
                 async_save: bool = True, read_only: bool = False):
        if save_every < 1:
            raise ValueError(f"save_every must be >= 1, got {save_every}")
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        if best_mode not in ("max", "min"):
            raise ValueError(f"best_mode must be 'max' or 'min', got {best_mode!r}")
        directory = os.fspath(directory)                # str, pathlib or etils.epath paths
        if "://" not in directory:                      # keep gs:// etc. as they are
            directory = os.path.abspath(directory)
        self.save_every, self.keep_last, self._read_only = save_every, keep_last, read_only
        self.best_metric, self.best_mode = best_metric, best_mode

        # Find steps with the commit-marker check (see the module docstring); writes use
        # orbax's default atomicity for the filesystem (atomic rename on POSIX).
        self._name_format = ocp.step.standard_name_format(
            atomicity_options=ocp.options.AtomicityOptions(mode=ocp.options.AtomicityMode.COMMIT_FILE))
        preserve: list[Any] = [ocm.LatestN(n=keep_last)]
        best_fn = None
        if best_metric is not None:
            # a checkpoint without the metric ranks below all scored ones
            unscored = -math.inf if best_mode == "max" else math.inf
            best_fn = lambda metrics: metrics.get(best_metric, unscored)  # noqa: E731
            preserve.append(ocm.BestN(get_metric_fn=best_fn, reverse=best_mode == "min", n=1,
                                      keep_checkpoints_without_metrics=False))
        registry = ocp.handlers.DefaultCheckpointHandlerRegistry()
        for item, save_args, restore_args in ((_STATE, ocp.args.StandardSave, ocp.args.StandardRestore),
                                              (_META, ocp.args.JsonSave, ocp.args.JsonRestore)):
            registry.add(item, save_args)
            registry.add(item, restore_args)
        with _quiet_absl(read_only):                # orbax warns that a read-only manager is read-only
            options = ocp.CheckpointManagerOptions(
                save_decision_policy=ocm.AnySavePolicy([ocm.FixedIntervalPolicy(save_every),
                                                        ocm.PreemptionCheckpointingPolicy()]),
                preservation_policy=ocm.AnyPreservationPolicy(preserve),
                # best_fn/best_mode only make the manager record metrics and answer best_step();
                # retention is decided by preservation_policy alone.
                best_fn=best_fn, best_mode=best_mode,
                step_name_format=self._name_format,
                enable_async_checkpointing=async_save,
                # read-only (e.g. `swarmjax eval` beside a running job): never create the
                # directory, never delete the trainer's in-flight tmp steps, never save
                read_only=read_only,
                cleanup_tmp_directories=not read_only,
                create=not read_only)
            self._mngr = ocp.CheckpointManager(directory, options=options, handler_registry=registry)

    @property
    def directory(self) -> str:
        return os.fspath(self._mngr.directory)

    # ------------------------------------------------------------------ save
    def save(self, step: int, state: Any, meta: dict, *, metrics: dict | None = None,
             force: bool = False) -> bool:
        """Start writing a checkpoint of ``state`` (any pytree of arrays, normally a
        TrainState) and ``meta`` (JSON dict) at ``step`` when ``step % save_every == 0`` or
        ``force``; returns whether a save was started. Returns once the arrays are copied
        to host memory; writing continues in the background (``wait()`` blocks until it is
        on disk). A step that is already saved is not written again; without ``force`` a
        step not after the latest checkpoint is skipped, with ``force`` it is an error.
        Raises ValueError if ``meta`` does not survive a JSON round trip unchanged or a
        metric is not a number."""
        step = int(step)
        if self._read_only:
            raise ValueError(f"{self.directory} was opened read-only")
        steps = self._mngr.all_steps()
        if step in steps:
            return False
        if not force and not self._mngr.should_save(step):
            return False
        if steps and step < max(steps):
            # orbax keeps its step list in save order and LatestN takes the last entries
            # as the newest: an older step saved after a newer one would be mis-ranked.
            raise ValueError(f"cannot save step {step} in {self.directory}: it is before the "
                             f"latest checkpoint {max(steps)}")
        meta = _json_copy(meta)
        self._mngr.save(step, args=ocp.args.Composite(**{_STATE: ocp.args.StandardSave(state),
                                                          _META: ocp.args.JsonSave(meta)}),
                        metrics=self._tracked_metrics(metrics), force=True)
        return True

    def _tracked_metrics(self, metrics: dict | None) -> dict | None:
        """Metrics handed to orbax: None when no best metric is tracked (orbax then
        records none); else the finite ones among ``metrics``, ``{}`` if there are none.

        Always a dict when tracking: orbax logs "Requested `tracked_metric`; did not
        provide metrics" for every save whose metrics are None. A dict without
        ``best_metric`` (none given, or not finite) scores -inf ("max") / +inf ("min")
        under ``best_fn``, so it never outranks a scored checkpoint and
        :meth:`best_step` does not count it."""
        if self.best_metric is None:
            return None
        try:
            out = {str(k): float(v) for k, v in (metrics or {}).items()}
        except (TypeError, ValueError) as e:
            raise ValueError(f"metrics must map names to numbers, got {metrics!r}") from e
        return {k: v for k, v in out.items() if math.isfinite(v)}

    # ------------------------------------------------------------------ queries
    def _is_complete(self, step: int) -> bool:
        try:
            self._name_format.find_step(self._mngr.directory, step)
            return True
        except ValueError:
            return False

    def _score(self, step: int) -> float | None:
        """The (finite) ``best_metric`` checkpoint ``step`` recorded, or None (unscored)."""
        metrics = self._mngr.metrics(step)
        return None if metrics is None else metrics.get(self.best_metric)

    def all_steps(self) -> list[int]:
        """Finalised checkpoint steps, ascending."""
        return [s for s in sorted(self._mngr.all_steps()) if self._is_complete(s)]

    def latest_step(self) -> int | None:
        """Newest finalised checkpoint (a save still in flight does not count), or None."""
        for s in sorted(self._mngr.all_steps(), reverse=True):
            if self._is_complete(s):
                return s
        return None

    def best_step(self) -> int | None:
        """Finalised checkpoint with the best ``best_metric``; None if no finalised
        checkpoint has metrics (or ``best_metric`` is None)."""
        if self.best_metric is None:
            return None
        best = self._mngr.best_step()
        if best is None or self._is_complete(best):
            # unscored checkpoints rank last: if orbax's best has no score, none has
            return best if best is not None and self._score(best) is not None else None
        # The best is the save still in flight; until it is finalised the previous best
        # is still on disk (orbax deletes only after finalising).
        scored = [(v, s) for s in self.all_steps() if (v := self._score(s)) is not None]
        if not scored:
            return None
        return (max if self.best_mode == "max" else min)(scored)[1]

    def step_of(self, which: str) -> int:
        """The step ``which`` names: "latest", "best" or a step number (a CLI's
        ``--checkpoint``). Raises ValueError when there is no such checkpoint."""
        if which in ("latest", "best"):
            step = self.latest_step() if which == "latest" else self.best_step()
            if step is None and which == "best" and (step := self.latest_step()) is not None:
                print(f"no checkpoint in {self.directory} has a {self.best_metric} score (its evaluations were "
                      f"not kept): using the latest, step {step}", file=sys.stderr)
            if step is None:
                raise ValueError(f"no finished checkpoint in {self.directory}")
            return step
        if not which.isdigit():
            raise ValueError(f"checkpoint must be 'latest', 'best' or a step number, got {which!r}")
        return int(which)

    # ------------------------------------------------------------------ restore
    def restore(self, step: int | None, abstract_state: Any) -> tuple[Any, dict]:
        """Read checkpoint ``step`` (None: the latest finalised one) into the shapes,
        dtypes and shardings of ``abstract_state`` (a pytree of ``ShapeDtypeStruct`` with
        ``.sharding``, see :func:`abstract_state`); returns ``(state, meta)``. Waits for a
        save in flight first. Raises ValueError if there is no such finalised checkpoint,
        a leaf has no sharding, or the checkpoint's tree structure or shapes do not match."""
        step = self._finalised(step)
        _require_shardings(abstract_state)
        self._check_matches(step, abstract_state)
        try:
            restored = self._mngr.restore(step, args=ocp.args.Composite(
                **{_STATE: ocp.args.StandardRestore(abstract_state), _META: ocp.args.JsonRestore()}))
        except ValueError as e:       # anything else orbax objects to, on one line
            raise ValueError(f"cannot restore step {step} from {self.directory}: "
                             f"{' '.join(str(e).split())}") from e
        return restored[_STATE], restored[_META]

    def read(self, step: int) -> tuple[Any, dict]:
        """Checkpoint ``step`` as saved, with no target tree: ``(state, meta)`` with the
        state's arrays whole on this process's first device, whatever mesh or device count
        wrote them (what a reader that does not know the optimizer's state, e.g. an export
        of the params on a laptop of a run trained on a pod, uses). Raises ValueError if
        there is no such finalised checkpoint."""
        step = self._finalised(step)
        device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        saved = self._mngr.item_metadata(step)[_STATE]
        target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype, sharding=device),
                              getattr(saved, "tree", saved), is_leaf=lambda m: hasattr(m, "shape"))
        restored = self._mngr.restore(step, args=ocp.args.Composite(
            **{_STATE: ocp.args.StandardRestore(target), _META: ocp.args.JsonRestore()}))
        return restored[_STATE], restored[_META]

    def _finalised(self, step: int | None) -> int:
        """``step`` (None: the latest) once a save in flight is done; ValueError when it
        is not a finalised checkpoint."""
        self.wait()
        if step is None:
            step = self.latest_step()
            if step is None:
                raise ValueError(f"no finalised checkpoint in {self.directory}")
        elif not self._is_complete(int(step)):
            raise ValueError(f"no finalised checkpoint for step {step} in {self.directory} "
                             f"(finalised steps: {self.all_steps()})")
        return int(step)

    def _check_matches(self, step: int, abstract: Any) -> None:
        """Compare the saved array names and shapes with ``abstract`` before reading, so
        a mismatch gives one line naming the leaves (orbax reports structure differences
        as a multi-line tree dump and shape differences without the leaf name)."""
        saved_md = self._mngr.item_metadata(step)[_STATE]
        saved = ocp.tree.to_flat_dict(getattr(saved_md, "tree", saved_md), sep=".")
        wanted = ocp.tree.to_flat_dict(abstract, sep=".")
        problems = []
        if missing := [k for k in wanted if k not in saved]:
            problems.append(f"not in the checkpoint: {_some(missing)}")
        if extra := [k for k in saved if k not in wanted]:
            problems.append(f"in the checkpoint but not in abstract_state: {_some(extra)}")
        shapes = [f"{k} saved {tuple(saved[k].shape)} vs wanted {tuple(v.shape)}"
                  for k, v in wanted.items()
                  if k in saved and hasattr(saved[k], "shape") and hasattr(v, "shape")
                  and tuple(saved[k].shape) != tuple(v.shape)]
        if shapes:
            problems.append(f"shape mismatch: {_some(shapes)}")
        if problems:
            raise ValueError(f"checkpoint step {step} in {self.directory} does not match "
                             f"abstract_state: {'; '.join(problems)}")

    # ------------------------------------------------------------------ lifecycle
    def wait(self) -> None:
        """Block until the save in flight (if any) is finalised and old checkpoints are
        deleted; re-raises an error of the background write."""
        self._mngr.wait_until_finished()

    def close(self) -> None:
        """Wait, then release orbax's threads. Call at the end of the job."""
        self._mngr.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@contextlib.contextmanager
def _quiet_absl(quiet: bool):
    """absl's (orbax's) warnings off inside the block when ``quiet``."""
    logger = logging.getLogger("absl")
    level = logger.level
    if quiet:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _json_copy(meta: dict) -> dict:
    """A JSON round-trip copy of ``meta``; ValueError if it is not JSON or would come back
    different (tuples, non-string keys, NaN, numpy scalars...)."""
    if not isinstance(meta, dict):
        raise ValueError(f"meta must be a dict, got {type(meta).__name__}")
    try:
        copy = json.loads(json.dumps(meta))
    except (TypeError, ValueError) as e:
        raise ValueError(f"meta is not JSON-serialisable: {e}") from e
    if copy != meta:
        raise ValueError("meta does not survive a JSON round trip unchanged (tuples, "
                         "non-string keys or NaN?); convert it to plain dicts/lists/str/"
                         "int/float first")
    return copy


def _require_shardings(abstract: Any) -> None:
    for path, leaf in jax.tree_util.tree_leaves_with_path(abstract):
        if getattr(leaf, "sharding", None) is None:
            raise ValueError(f"abstract_state leaf {jax.tree_util.keystr(path)} has no sharding; "
                             "build it with swarmjax.train.checkpoint.abstract_state(shapes, shardings)")


def _some(items: list[str], n: int = 3) -> str:
    more = f" (+{len(items) - n} more)" if len(items) > n else ""
    return ", ".join(items[:n]) + more
