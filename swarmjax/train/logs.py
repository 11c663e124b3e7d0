"""What a training job writes besides checkpoints: JSONL logs (optionally mirrored to
TensorBoard), the summary table and the learning-curve PNG. Only the primary process
(``jax.process_index() == 0``) writes; the others get a log that drops everything.

Paths go through ``etils.epath``, so a workdir may be local or in an object store
(``gs://``, ``s3://``: needs ``gcsfs`` / ``s3fs`` or TensorFlow for epath). Object
stores cannot append to a file: there the log keeps each file's lines and rewrites
the file at :meth:`JobLog.sync` (the job calls it before every checkpoint, so a
finished checkpoint never has fewer log lines than it covers) and at close.
"""

from __future__ import annotations

import json
import logging
import pathlib
import shutil
import sys
from collections.abc import Callable
from typing import Any

import jax
from etils import epath

PathLike = epath.PathLike

_log = logging.getLogger(__name__)


def is_local(path: PathLike) -> bool:
    """Whether ``path`` is on a POSIX filesystem (no ``scheme://`` prefix)."""
    return "://" not in str(path)


def progress_bar(total: int, desc: str, enabled: bool, *, initial: int = 0):
    """A tqdm bar for a job's long loops (disabled: nothing printed)."""
    from tqdm.auto import tqdm
    return tqdm(total=total, initial=initial, desc=desc, disable=not enabled, dynamic_ncols=True, leave=True)


class JobLog:
    """``metrics.jsonl`` (one line per SFT / PARL step), ``eval.jsonl`` (per evaluation
    and task size), ``traces.jsonl`` (orchestration traces), ``atif.jsonl`` (the same
    episodes as ATIF trajectories with their token ids: :mod:`swarmjax.traces.atif`).

    Fresh start (``resume_step`` None): the files are started empty and an earlier
    attempt's TensorBoard events (``tb/``) are deleted, so a run killed before its
    first checkpoint and started again logs every line once. Resume from PARL step
    ``resume_step``: the files are first cut back to the lines written before that
    step began (:func:`truncate`; ``keep_final`` keeps the final evaluation of a run
    that had already finished), then appended to, so a resumed run's logs equal an
    uninterrupted run's. A warm start continued from its own checkpoint after
    ``warm_step`` steps (:mod:`swarmjax.train.warm_steps`) keeps its lines before that
    step in the same way. TensorBoard event files go to ``tb/sft`` and ``tb/rl`` when
    ``tensorboardX`` is installed; a resume hides the RL events it recomputes
    (TensorBoard's ``purge_step``). In an object store they are written to a local
    directory and copied to ``tb/`` at :meth:`sync` and :meth:`close` (tensorboardX's own
    GCS writer uploads its whole file at every flush, and once more when collected, at
    the interpreter's exit).

    ``append``: write each line to the file at once (default on local paths: a killed
    run loses nothing) or, False (default on object stores), keep the lines and
    rewrite the files at :meth:`sync` and :meth:`close`."""

    NAMES = ("metrics.jsonl", "eval.jsonl", "traces.jsonl", "atif.jsonl")

    def __init__(self, workdir: PathLike, resume_step: int | None, enabled: bool = True, *,
                 keep_final: bool = False, append: bool | None = None, warm_step: int | None = None):
        self.enabled = enabled
        self.workdir = epath.Path(workdir)
        self.append = is_local(workdir) if append is None else append
        self.files: dict[str, Any] = {}
        self.lines: dict[str, list[str]] = {}
        self.tb = None
        self.staged: str | None = None     # an object store's TensorBoard events, written here first
        if not enabled:
            return
        self.workdir.mkdir(parents=True, exist_ok=True)
        cont = resume_step is not None or warm_step is not None
        for name in self.NAMES:
            path = self.workdir / name
            kept = [] if not cont else truncate(path, resume_step or 0, keep_final=keep_final, sft_before=warm_step)
            if self.append:
                self.files[name] = path.open("a" if cont else "w")
            else:
                self.lines[name] = kept
                _write_lines(path, kept)
        if not cont and (self.workdir / "tb").exists():
            (self.workdir / "tb").rmtree()          # events of an attempt that never checkpointed
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            return
        tb = self.workdir / "tb"
        if not is_local(self.workdir):                  # staged locally, copied at sync and close
            import tempfile
            self.staged = tempfile.mkdtemp(prefix="swarmjax-tb-")
            tb = epath.Path(self.staged)
        try:
            # two TensorBoard runs: the warm start, and RL with its evaluations. The RL
            # x axis is steps done (training step i is drawn at i + 1, with the evaluation
            # after it); a resume from checkpoint s recomputes from s + 1, so the events
            # from there on are hidden (purge_step) and the curves equal an uninterrupted run's
            self.tb = {"sft": SummaryWriter(str(tb / "sft"), purge_step=warm_step),
                       "rl": SummaryWriter(str(tb / "rl"),
                                           purge_step=None if resume_step is None else resume_step + 1)}
        except (ImportError, OSError, ValueError) as e:     # e.g. gs:// without google-cloud-storage
            _log.warning("swarmjax: no TensorBoard events in %s: %s", tb, e)
            self.tb = None

    def write(self, name: str, record: dict) -> None:
        if not self.enabled:
            return
        line = json.dumps(record) + "\n"
        if self.append:
            self.files[name].write(line)
            self.files[name].flush()
        else:
            self.lines[name].append(line)
        # TensorBoard: curves only (the final test evaluation is in summary.json; a
        # shorter run's final one, which a resume replaces, would otherwise stay drawn)
        if self.tb is not None and name in ("metrics.jsonl", "eval.jsonl") and record.get("policy") != "final":
            tag = record.get("stage") or "/".join(["eval", record["split"], record["policy"]])
            writer = self.tb["sft" if tag == "sft" else "rl"]
            step = record["step"] + (tag == "rl")     # a training step's line: steps done
            figures = [(tag, record)] + [(f"{tag}/n{n}", row) for n, row in record.get("sizes", {}).items()]
            for prefix, row in figures:
                for k, v in row.items():
                    if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step":
                        writer.add_scalar(f"{prefix}/{k}", v, step)

    def sync(self) -> None:
        """Make every line written so far durable (object stores: rewrite the files;
        local files are written line by line already)."""
        if not self.enabled or self.append:
            return
        for name, lines in self.lines.items():
            _write_lines(self.workdir / name, lines)
        if self.staged is not None:
            for writer in (self.tb or {}).values():
                writer.flush()
            for path in pathlib.Path(self.staged).rglob("events.*"):
                target = self.workdir / "tb" / str(path.relative_to(self.staged))
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(path.read_bytes())

    def close(self) -> None:
        for writer in (self.tb or {}).values():
            writer.close()                      # every queued event written
        self.tb = None
        self.sync()
        for f in self.files.values():
            f.close()
        self.files = {}
        if self.staged is not None:
            shutil.rmtree(self.staged, ignore_errors=True)
            self.staged = None


def keep_line(row: dict, step: int, *, keep_final: bool = False, sft_before: int | None = None) -> bool:
    """Whether a log line belongs to the run up to PARL step ``step``: SFT and warm-start
    lines always (with ``sft_before``, a warm start continued from that many steps: its
    steps before), a training step before ``step``, a periodic evaluation or trace at
    ``step`` or before; a "final" evaluation only with ``keep_final`` (resuming a run
    that had finished at ``step``: otherwise it is the end of a shorter run, which the
    resumed run replaces by its own)."""
    if "stage" in row:                                    # metrics.jsonl
        if row["stage"] == "sft":
            return sft_before is None or row["step"] < sft_before
        return row["step"] < step
    if "policy" in row:                                   # eval.jsonl
        label, at = row["policy"], row["step"]
    else:                                                 # traces, ATIF: <label>-s<step>-n<n>-<b>
        parts = row.get("trace_id", row.get("trajectory_id", "")).split("-")
        label, at = parts[0], int(parts[1][1:])
    if label == "final":
        return keep_final and at <= step
    return label == "warm_start" or at <= step


def truncate(path: PathLike, step: int, *, keep_final: bool = False, sft_before: int | None = None) -> list[str]:
    """Keep only the lines of ``path`` written before PARL step ``step`` (see
    :func:`keep_line`, also for ``sft_before``); returns them. A torn last line (the
    process was killed while writing it) is dropped. The file is replaced in one rename
    where the filesystem has one, so a kill during the truncation leaves the old or the new file."""
    path = epath.Path(path)
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines(keepends=True):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue                                      # torn by a kill mid-write
        if keep_line(row, step, keep_final=keep_final, sft_before=sft_before):
            rows.append(line if line.endswith("\n") else line + "\n")
    _write_lines(path, rows)
    return rows


def _write_lines(path: epath.Path, lines: list[str]) -> None:
    """Write ``lines`` to ``path``: through a temporary file and a rename on local paths
    (atomic), directly on object stores (an object is replaced whole anyway)."""
    if is_local(path):
        tmp = path.parent / (path.name + ".tmp")
        tmp.write_text("".join(lines))
        tmp.replace(path)
    else:
        path.write_text("".join(lines))


def write_summary(workdir: PathLike, summary: dict[str, Any], table: Callable[[dict[str, Any]], str]) -> None:
    """A job's ``summary.json`` (indented) and ``summary.md`` (``table(summary)``) in ``workdir``."""
    workdir = epath.Path(workdir)
    (workdir / "summary.json").write_text(json.dumps(summary, indent=2))
    (workdir / "summary.md").write_text(table(summary) + "\n")


def change(name: str, before: float, after: float, *, higher_is_better: bool, digits: int = 3) -> str:
    """``"name before -> after (better|worse|same)"``: how a figure moved, in words."""
    word = "same" if abs(after - before) < 1e-9 else ("better" if (after > before) == higher_is_better else "worse")
    return f"{name} {before:.{digits}f} -> {after:.{digits}f} ({word})"


def curves(workdir: PathLike, keys: tuple[str, ...] = ("reward", "item_f1", "critical_steps", "subagents")
           ) -> None:
    """curves.png: the warm start's loss; the RL steps' ``keys`` (batch means of the
    training rollouts: reward, item-F1 / accuracy, critical steps and sub-agents; a key
    the steps do not log is left out) per step."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:                # a dependency: only a broken install lacks it
        say("curves.png not written: matplotlib does not import (pip install matplotlib)")
        return
    workdir = epath.Path(workdir)
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rl = [r for r in rows if r["stage"] != "sft"]
    sft = [r for r in rows if r["stage"] == "sft"]
    keys = tuple(k for k in keys if any(k in r for r in rl)) or keys
    fig, axes = plt.subplots(1, 1 + len(keys), figsize=(4 * (1 + len(keys)), 3.4))
    axes[0].plot([r["step"] for r in sft], [r["loss"] for r in sft])
    axes[0].set_title("warm start loss")
    for ax, k in zip(axes[1:], keys):
        ax.plot([r["step"] for r in rl if k in r], [r[k] for r in rl if k in r])
        ax.set_title(f"RL {k}")
        ax.set_xlabel("step")
    fig.tight_layout()
    with (workdir / "curves.png").open("wb") as f:
        fig.savefig(f, format="png", dpi=100)
    plt.close(fig)


def say(text: str) -> None:
    """One progress line on stderr from the process that writes the logs (process 0):
    what a long job is doing where no bar moves (loading, playing demonstrations,
    evaluating)."""
    if jax.process_index() == 0:
        from tqdm.auto import tqdm
        tqdm.write(text, file=sys.stderr)              # above a bar that is running, not inside it


def log_line(progress: bool, every: int, i: int, total: int, what: str, m: dict, keys: tuple[str, ...]) -> None:
    """After step ``i`` (0-based) of ``total``: a line on stderr every ``every`` steps and
    at the last, with the figures ``keys`` of the step's metrics ``m``, where progress
    bars are off (``progress`` False) on the process that writes the logs (process 0);
    ``every`` 0: never."""
    if progress or jax.process_index() != 0 or not every or ((i + 1) % every and i + 1 != total):
        return
    figures = ", ".join(f"{k} {m[k]:.3f}" for k in keys if k in m)
    print(f"{what} step {i + 1}/{total}: {figures}", file=sys.stderr, flush=True)


class SignalWatch:
    """Says when RL has nothing to learn from: a group-relative advantage is zero for every
    episode of a group whose rewards are all equal (all right or, often, all wrong), so
    when no group of ``patience`` consecutive steps carries a signal (the step metric
    ``signal_groups``, the fraction of groups whose rewards differ, is 0) the policy gets
    no gradient from its reward and does not change. One warning on stderr per such
    stretch, from the process that writes the logs, naming the figures and what to try.

    >>> watch = SignalWatch()
    >>> for step in ...: watch(step, metrics)      # after each RL step
    """

    def __init__(self, patience: int = 3):
        if patience < 1:
            raise ValueError(f"patience must be >= 1, got {patience}")
        self.patience, self.flat, self.warned = patience, 0, False

    def __call__(self, step: int, m: dict) -> str | None:
        """Record RL step ``step``'s metrics ``m``; returns the warning when it is given."""
        if "signal_groups" not in m:
            return None
        if m["signal_groups"] > 0:
            self.flat, self.warned = 0, False
            return None
        self.flat += 1
        if self.flat < self.patience or self.warned:
            return None
        self.warned = True
        reward = f"{m['reward']:.3f}" if "reward" in m else "?"
        text = (f"warning: RL steps {step + 2 - self.flat}-{step + 1} had no learning signal: in every group all "
                f"episodes got the same reward (signal_groups 0.000, mean reward {reward}), so the update is zero "
                "and the policy does not change. Try a warm start (sft=...) or a longer one, a larger group_size, "
                "a higher sampling temperature, or easier problems.")
        say(text)
        return text
