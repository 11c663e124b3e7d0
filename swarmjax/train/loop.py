"""The one training loop of every job: start or restore, RL steps, evaluations,
checkpoints, preemption, summary.

A job plugs its pieces into :func:`run_loop` as a :class:`JobRun` (the one job's:
:class:`~swarmjax.train.agent_job.AgentRun`, any task on any engine). A run brings its learner, engine,
task stream, RL config, how it warm-starts, evaluates and sums up; the loop owns
everything in between, the same for every job:

1. **Start** (``latest`` None): :meth:`JobRun.start` (the warm start and the learner's
   state), the start's evaluations (:attr:`JobRun.start_splits`), checkpoint 0 (RL's
   start survives a crash in RL), a safe point. **Resume**: :func:`restore` of the
   newest finished checkpoint on the learner's mesh, the identity checked, the task
   stream put back where the checkpoint left it, the logs cut back to its step. Either
   way ``config.txt`` (the config's repr) is written.
2. **RL**: per step :meth:`JobRun.rl_step` (by default ``rl.tasks_per_step`` problems
   of the stream through :func:`~swarmjax.train.agent_rl.rl_step`, sampled with
   the engine's key of step ``s``, ``engine.step_key(rl_key, s)``) or, with ``rl.async_rollout``, a batch
   rolled out ahead (:meth:`JobRun.async_rollouts`); a metrics line, the no-signal
   watch, a progress bar and log lines; frozen sub-agents refreshed when due.
3. **Evaluations and checkpoints**: the validation split every ``eval_every`` steps
   (labelled with the stage) and after the last (labelled "final" unless it is a
   periodic one; its figures score the checkpoint: :meth:`JobRun.score`), the
   test split at the start and the end (the summary's table); a checkpoint at every
   evaluation and at a preemption notice (and, with ``checkpoint_every``, whenever the
   checkpointer's period says: the safe point stops there, after the last step's save), its
   ``meta``: ``step``, ``job`` (identity), ``wall_clock_s``, ``warm_start_s``,
   ``stream``, ``async``, ``evals`` (the test split's figures by label) and the run's
   own keys.
4. **Summary**: :meth:`JobRun.summary` from the last checkpoint's meta.

A resumed run computes what an uninterrupted one does: every random draw is keyed by
the step, the stream is restored, the logs continue the same lines.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import jax
from etils import epath

from swarmjax.train.agent_rl import learn, rl_step
from swarmjax.train.agent_async import async_rollouts
from swarmjax.train.checkpoint import Checkpointer, abstract_state
from swarmjax.train.frame import CheckpointConfig, check_identity
from swarmjax.train.logs import SignalWatch, JobLog, log_line, progress_bar
from swarmjax.train.preemption import Preempted, PreemptionWatch
from swarmjax.train.subagents import refresh_subagents
from swarmjax.train.warm_steps import WarmSteps

__all__ = ["JobRun", "adapters_only", "evaluate_checkpoint", "open_checkpoint", "restore", "run_loop"]


class JobRun:
    """What a job plugs into :func:`run_loop` (attributes set by the job's constructor).

    job: the job's config (``workdir/config.txt`` holds its repr).
    learner, engine, stream, rl, steps: the :class:`~swarmjax.rl.update.Learner`, the
      rollout engine (:mod:`swarmjax.train.engines`), the training problems' stream
      (:mod:`swarmjax.train.streams`: ``take``, ``ids``, ``state``, ``restore``), the RL
      stage's config (``tasks_per_step``, ``async_rollout``, ``refresh_subagents``:
      :class:`~swarmjax.train.agent.TextRLConfig`), its step count.
    rl_key: the RL steps' sampling key; subagents: "frozen" or "shared".
    identity, may_change: the job's identity (a resume must match it) and what may
      differ, for the error.
    eval_every, log_every, primary: evaluation and log cadence; whether this process
      writes the logs.
    stage, title, start_label: the metrics lines' stage ("rl"), the progress bar's and
      preemption's name ("RL"), the start evaluation's label ("initial").
    start_splits: the splits evaluated at the start ("validation" scores checkpoint 0).
    log_keys: the figures of the log lines.
    checkpoint_every: 0: checkpoints at evaluations and preemptions only; else a save
      is offered after every step (the checkpointer keeps every ``every``-th).
    warm_every, warm_identity: warm-start steps between its checkpoints (0: only at a
      preemption notice) and what they are checked against on a continue
      (:class:`~swarmjax.train.warm_steps.WarmSteps`).

    Class attributes, what the job frame and ``swarmjax eval`` read
    (:mod:`swarmjax.train.jobs`): ``best_metric`` (the checkpoints' score that picks the
    best one), ``checked`` (the identity fields an evaluated checkpoint must share with
    the config: the policy's and the held-out set's; None: all), :meth:`table` (the
    summary's and a checkpoint evaluation's table).
    """

    job: Any
    learner: Any
    engine: Any
    stream: Any
    rl: Any
    steps: int
    rl_key: jax.Array
    subagents: str = "frozen"
    identity: dict[str, str]
    may_change: str
    eval_every: int
    log_every: int
    primary: bool = True
    stage: str = "rl"
    title: str = "RL"
    start_label: str = "initial"
    start_splits: tuple[str, ...] = ("validation", "test")
    log_keys: tuple[str, ...] = ("reward", "accuracy")
    checkpoint_every: int = 0
    warm_every: int = 0
    warm_identity: dict[str, str] = {}
    best_metric: str = "accuracy"
    checked: tuple[str, ...] | None = None

    @staticmethod
    def checkpointing(job: Any) -> CheckpointConfig:
        """How often the job checkpoints and how many checkpoints it keeps (by default a
        checkpoint at every evaluation and preemption, the last two and the best kept)."""
        return CheckpointConfig(every=1, keep_last=2)

    @staticmethod
    def table(summary: dict) -> str:
        """Markdown of a summary (:meth:`summary`) or a checkpoint evaluation (:meth:`report`)."""
        raise NotImplementedError

    def start_state(self, state: Any) -> Any | None:
        """The state with the start's policy as its params when the RL state holds it (e.g.
        frozen sub-agents that are the policy RL started from), else None."""
        return None

    def report(self, step: int, start: dict | None, final: dict, meta: dict, split: str, seconds: float) -> dict:
        """A checkpoint evaluation (``swarmjax eval``) as :meth:`table` prints it: its
        ``final`` figures (:meth:`evaluate` of checkpoint ``step`` on ``split``), the
        start's (:meth:`evaluate` of :meth:`start_state`, or None), the checkpoint's meta,
        the evaluations' wall clock."""
        raise NotImplementedError

    def state_shapes(self) -> Any:
        """The learner state's shapes (``jax.eval_shape``), to restore a checkpoint into."""
        raise NotImplementedError

    def lora_base(self) -> Any | None:
        """A LoRA run's frozen base params (its checkpoints hold the adapters alone); None
        for a run that trains the whole model."""
        return None

    def start(self, log: JobLog, saves: WarmSteps) -> tuple[Any, dict]:
        """A fresh run's RL state (the warm start done, continued from and saved to
        ``saves``) and its meta: at least ``job`` and ``warm_start_s``. Raises
        :class:`Preempted` at a safe point."""
        raise NotImplementedError

    def ready(self, state: Any, meta: dict) -> None:
        """Called once the state is there, started or restored, before its first evaluation
        (e.g. an engine that needs the state, files a run writes either way)."""

    def evaluate(self, step: int, label: str, state: Any, split: str, log: JobLog) -> dict:
        """Evaluate ``state`` on ``split``, its lines to ``log``; returns its figures."""
        raise NotImplementedError

    def score(self, evals: dict) -> dict[str, float]:
        """The checkpoint's metrics from a validation evaluation's figures."""
        raise NotImplementedError

    def rl_step(self, state: Any, step: int) -> tuple[Any, dict]:
        """RL step ``step`` on the stream's next problems: :func:`~swarmjax.train.agent_rl.rl_step`
        with the engine's key of the step (``engine.step_key(rl_key, step)``)."""
        return rl_step(self.learner, state, self.engine, self.stream.take(self.rl.tasks_per_step),
                       self.engine.step_key(self.rl_key, step), self.rl, step=step, subagents=self.subagents)

    def async_rollouts(self, state: Any, meta: dict) -> Any:
        """The rollouts a batch ahead (``rl.async_rollout``), begun at ``meta``'s step."""
        tasks = self.rl.tasks_per_step

        def draw():                                     # (problems, their ids in the stream)
            ids = self.stream.ids(tasks)
            return self.stream.take(tasks), ids
        return async_rollouts(self.rl, self.engine, state, draw=draw, stream_state=self.stream.state,
                              key=self.rl_key, step=meta["step"], saved=meta.get("async"), subagents=self.subagents)

    def async_step(self, rollouts: Any, state: Any) -> tuple[Any, dict]:
        """An RL step on the oldest batch rolled out ahead."""
        return rollouts.step(state, functools.partial(learn, self.learner), lambda c: dict(c.metrics))

    def postfix(self, m: dict) -> dict[str, str]:
        """The progress bar's figures of an RL step's metrics."""
        return {k: f"{m[k]:.3f}" for k in self.log_keys[:2]}

    def summary(self, meta: dict, wall_clock_s: float) -> dict:
        """The run's summary from its meta (written by the job on process 0)."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the run's tools and engines (after the loop, on any exit)."""


def adapters_only(state: Any) -> Any:
    """What a checkpoint holds of a ``TrainState`` (or its shapes, or its shardings): with
    LoRA params (``params["lora"]``) the adapters alone, the frozen base being the run's
    own (its ``hf_path``, or its seed's random model: :meth:`JobRun.lora_base`); any other
    state whole."""
    params = getattr(state, "params", None)
    if isinstance(params, dict) and "lora" in params:
        return state.replace(params={"lora": params["lora"]})
    return state


def restore(ckpt: Checkpointer, step: int, shapes: Any, learner: Any, *, base: Any = None) -> tuple[Any, dict]:
    """(state, meta) of checkpoint ``step``, laid out as ``shapes`` on the ``learner``'s
    mesh (its state shardings), else on the first device: any device count reads a
    checkpoint whatever wrote it. ``base``: a LoRA run's frozen base params, which its
    checkpoints leave out (:func:`adapters_only`): the state gets them back."""
    shardings = jax.sharding.SingleDeviceSharding(jax.devices()[0]) if learner.mesh is None else \
        learner.state_shardings(shapes)
    if base is None:
        return ckpt.restore(step, abstract_state(shapes, shardings))
    single = isinstance(shardings, jax.sharding.Sharding)
    state, meta = ckpt.restore(step, abstract_state(adapters_only(shapes), shardings if single else
                                                    adapters_only(shardings)))
    base = jax.device_put(base, shardings if single else {k: shardings.params[k] for k in base})
    return state.replace(params={**base, "lora": state.params["lora"]}), meta


def open_checkpoint(workdir: str, which: str, *, shapes: Any, learner: Any, identity: dict[str, str],
                    checked: tuple[str, ...] | None, base: Any = None) -> tuple[int, Any, dict]:
    """(step, state, meta) of checkpoint ``which`` ("latest", "best" or a step) of the run
    in ``workdir``, opened read-only (it may run beside the training job) and restored as
    ``shapes`` on ``learner``'s mesh (:func:`restore`); ValueError when there is none, or
    when the run that wrote it differs from ``identity`` (a config's) in a field of
    ``checked`` (None: any field). ``base``: a LoRA run's base params (:func:`restore`)."""
    directory = epath.Path(workdir) / "checkpoints"
    if not directory.is_dir():
        raise ValueError(f"no checkpoints in {workdir}")
    with Checkpointer(str(directory), save_every=1, read_only=True) as ckpt:
        step = ckpt.step_of(which)
        state, meta = restore(ckpt, step, shapes, learner, base=base)
    saved = meta.get("job", {})
    differ = [k for k in (identity if checked is None else checked) if saved.get(k) != identity.get(k)]
    if differ:
        raise ValueError(f"the checkpoint in {workdir} was made by a job with another {', '.join(differ)}")
    return step, state, meta


def check_split(split: str) -> None:
    """One-line ValueError unless ``split`` is a held-out split a checkpoint is evaluated on."""
    if split not in ("validation", "test"):
        raise ValueError(f"split must be 'validation' or 'test', got {split!r}")


def evaluate_checkpoint(run: JobRun, workdir: str, *, which: str = "latest", split: str = "test") -> dict:
    """Evaluate checkpoint ``which`` of the run in ``workdir`` (:func:`open_checkpoint`:
    the fields :attr:`JobRun.checked` the same) on the held-out ``split`` of ``run``'s
    config (greedy, as the run's own evaluations), and the start's policy when the state
    holds it (:meth:`JobRun.start_state`): what :meth:`JobRun.report` makes of them, with
    ``step``. Writes nothing."""
    check_split(split)
    step, state, meta = open_checkpoint(workdir, which, shapes=run.state_shapes(), learner=run.learner,
                                        identity=run.identity, checked=run.checked, base=run.lora_base())
    run.ready(state, meta)
    log = JobLog(workdir, None, False)                  # nothing written
    clock = time.perf_counter()
    start = run.start_state(state)
    first = None if start is None else run.evaluate(step, run.start_label, start, split, log)
    final = run.evaluate(step, "final", state, split, log)
    return {"step": step, **run.report(step, first, final, meta, split, time.perf_counter() - clock)}


def run_loop(run: JobRun, workdir: str, ckpt: Checkpointer, latest: int | None, watch: PreemptionWatch,
             progress: bool, *, resume_warm: bool = False) -> dict:
    """Start (or continue from checkpoint ``latest``) and train ``run`` (module
    docstring); returns :meth:`JobRun.summary`. Raises :class:`Preempted` once a
    SIGTERM's checkpoint is written. ``resume_warm``: without ``latest``, continue the
    warm start from its own checkpoints (:mod:`swarmjax.train.warm_steps`; False: they
    are removed)."""
    clock = time.perf_counter()
    steps = run.steps
    if latest is not None:
        state, meta = restore(ckpt, latest, run.state_shapes(), run.learner, base=run.lora_base())
        check_identity(run.identity, meta.get("job", {}), "--resume", run.may_change)
        run.stream.restore(meta["stream"])
        # a run that had finished keeps its final evaluation lines (nothing recomputes them)
        log = JobLog(workdir, meta["step"], run.primary,
                         keep_final="final" in meta["evals"] and meta["step"] >= steps)
    else:
        saves = WarmSteps(workdir, run.warm_every, resume=resume_warm, identity=run.warm_identity, watch=watch)
        log = JobLog(workdir, None, run.primary, warm_step=saves.step)
    rollouts = None
    try:
        def evaluate(step: int, state: Any, *, start: bool = False) -> dict | None:
            """The evaluations after ``step`` steps: the start's (:attr:`JobRun.start_splits`),
            or the validation split (labelled as the stage's periodic evaluation when
            ``step`` is one, else "final": a longer run resumed from here keeps the one and
            recomputes the other) and after the last step the test split ("final"). Returns
            the validation figures (the checkpoint's score) or None; the test split's are
            kept in the meta by label."""
            if start:
                todo = [(split, run.start_label) for split in run.start_splits]
            else:
                periodic = bool(run.eval_every) and step % run.eval_every == 0
                todo = [("validation", run.stage if periodic else "final")] + [("test", "final")] * (step == steps)
            scored = None
            for split, label in todo:
                res = run.evaluate(step, label, state, split, log)
                if split == "validation":
                    scored = res
                else:
                    meta["evals"][label] = res
            return scored

        def save(step: int, state: Any, evals: dict | None, *, force: bool = True) -> None:
            """Checkpoint ``step`` (scored by ``evals`` when evaluated; unless ``force``,
            when the checkpointer's period says so), its logs first: a finished
            checkpoint has its lines."""
            nonlocal clock
            now = time.perf_counter()
            meta.update(step=step, wall_clock_s=meta["wall_clock_s"] + now - clock, stream=run.stream.state())
            if rollouts is not None:                    # the stream from the oldest batch not trained on
                meta["async"] = rollouts.checkpoint()
                meta["stream"] = meta["async"].pop("stream")
            clock = now
            log.sync()
            ckpt.save(step, adapters_only(state), meta, metrics=None if evals is None else run.score(evals),
                      force=force)

        if latest is None:
            try:
                state, meta = run.start(log, saves)
            finally:
                saves.close()
            saves.remove()                              # done: <workdir>/warm_start holds it
            meta.update(step=0, wall_clock_s=0.0, evals={})
            run.ready(state, meta)
            save(0, state, evaluate(0, state, start=True))   # RL's start survives a crash in RL
            if steps > 0 and watch.reached():           # safe point
                raise Preempted(0, workdir, stage=run.title)
        else:
            run.ready(state, meta)
        if run.primary:
            (epath.Path(workdir) / "config.txt").write_text(repr(run.job) + "\n")
        start = meta["step"]
        if run.rl.async_rollout.enabled:
            rollouts = run.async_rollouts(state, meta)
        bar = progress_bar(steps, run.title, progress, initial=min(start, steps))
        no_signal = SignalWatch()
        with bar:                                       # closed on a preemption too
            for step in range(start, steps):
                state, m = run.rl_step(state, step) if rollouts is None else run.async_step(rollouts, state)
                log.write("metrics.jsonl", {"stage": run.stage, "step": step, **m})
                no_signal(step, m)
                bar.update(1)
                bar.set_postfix(**run.postfix(m))
                log_line(progress, run.log_every, step, steps, run.title, m, run.log_keys)
                if run.rl.refresh_subagents.due(step + 1):     # the sub-agents become the policy from here on
                    state = refresh_subagents(state, "subagents")
                    if rollouts is not None:
                        rollouts.refresh(state.frozen["subagents"])
                done = step + 1
                evals = evaluate(done, state) if done == steps or run.eval_every and done % run.eval_every == 0 \
                    else None
                halt = done < steps and watch.reached()                  # safe point (the last step just ends)
                if evals is not None or halt or run.checkpoint_every:
                    save(done, state, evals, force=evals is not None or halt)
                if halt:
                    raise Preempted(done, workdir, stage=run.title)
    finally:
        if rollouts is not None:
            rollouts.close()
        log.close()
        run.close()
    return run.summary(meta, meta["wall_clock_s"] + time.perf_counter() - clock)
