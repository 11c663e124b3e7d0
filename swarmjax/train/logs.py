"""What a training job writes besides checkpoints: JSONL logs (optionally mirrored to
TensorBoard), the summary table and the learning-curve PNG. Only the primary process
(``jax.process_index() == 0``) writes; the others get a log that drops everything."""

from __future__ import annotations

import json
import os
from typing import Any


def progress_bar(total: int, desc: str, enabled: bool, *, initial: int = 0):
    """A tqdm bar for a job's long loops (disabled: nothing printed)."""
    from tqdm.auto import tqdm
    return tqdm(total=total, initial=initial, desc=desc, disable=not enabled, dynamic_ncols=True, leave=True)


class JobLog:
    """``metrics.jsonl`` (one line per SFT / PARL step), ``eval.jsonl`` (per evaluation
    and task size), ``traces.jsonl`` (orchestration traces). With ``resume_step`` the
    files are first cut back to the lines written before that PARL step began, then
    appended to, so a resumed run's logs equal an uninterrupted run's. TensorBoard
    event files go to ``tb/sft`` and ``tb/parl`` when ``tensorboardX`` is installed; a
    resume hides the PARL events it recomputes (TensorBoard's ``purge_step``)."""

    NAMES = ("metrics.jsonl", "eval.jsonl", "traces.jsonl")

    def __init__(self, workdir: str, resume_step: int | None, enabled: bool = True):
        self.enabled = enabled
        self.files, self.tb = {}, None
        if not enabled:
            return
        if resume_step is not None:
            for name in self.NAMES:
                truncate(os.path.join(workdir, name), resume_step)
        mode = "a" if resume_step is not None else "w"
        self.files = {name: open(os.path.join(workdir, name), mode) for name in self.NAMES}
        try:
            from tensorboardX import SummaryWriter
            tb = os.path.join(workdir, "tb")
            # two TensorBoard runs: the warm start, and PARL with its evaluations. The PARL
            # x axis is steps done (training step i is drawn at i + 1, with the evaluation
            # after it); a resume from checkpoint s recomputes from s + 1, so the events
            # from there on are hidden (purge_step) and the curves equal an uninterrupted run's
            self.tb = {"sft": SummaryWriter(os.path.join(tb, "sft")),
                       "parl": SummaryWriter(os.path.join(tb, "parl"),
                                             purge_step=None if resume_step is None else resume_step + 1)}
        except ImportError:
            pass

    def write(self, name: str, record: dict) -> None:
        if not self.enabled:
            return
        self.files[name].write(json.dumps(record) + "\n")
        self.files[name].flush()
        # TensorBoard: curves only (the final test evaluation is in summary.json; a
        # shorter run's final one, which a resume replaces, would otherwise stay drawn)
        if self.tb is not None and name != "traces.jsonl" and record.get("policy") != "final":
            tag = record.get("stage") or f"eval/{record['split']}/{record['policy']}/n{record['n']}"
            writer = self.tb["sft" if tag == "sft" else "parl"]
            step = record["step"] + (tag == "parl")
            for k, v in record.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step":
                    writer.add_scalar(f"{tag}/{k}", v, step)

    def close(self) -> None:
        for f in self.files.values():
            f.close()
        for writer in (self.tb or {}).values():
            writer.close()


def keep_line(row: dict, step: int) -> bool:
    """Whether a log line belongs to the run up to PARL step ``step``: SFT and warm-start
    lines always, a training step before ``step``, a periodic evaluation or trace at
    ``step`` or before; never a "final" evaluation (the end of a shorter run, which the
    resumed run replaces by its own)."""
    if "stage" in row:                                    # metrics.jsonl
        return row["stage"] == "sft" or row["step"] < step
    if "policy" in row:                                   # eval.jsonl
        label, at = row["policy"], row["step"]
    else:                                                 # traces: <label>-s<step>-n<n>-<b>
        parts = row["trace_id"].split("-")
        label, at = parts[0], int(parts[1][1:])
    return label == "warm_start" or (label != "final" and at <= step)


def truncate(path: str, step: int) -> None:
    """Keep only the lines of ``path`` written before PARL step ``step`` (see :func:`keep_line`)."""
    if not os.path.exists(path):
        return
    with open(path) as f:
        rows = [line for line in f if line.strip() and keep_line(json.loads(line), step)]
    with open(path, "w") as f:
        f.writelines(rows)


def summary_table(summary: dict[str, Any]) -> str:
    """Markdown: per task size, warm start vs final policy."""
    lines = ["| n | policy | item-F1 | critical steps | total steps | sub-agents | no-spawn |",
             "|---|---|---|---|---|---|---|"]
    for n in summary["warm_start"]:
        for label in ("warm_start", "final"):
            r = summary[label][n]
            lines.append(f"| {n} | {label.replace('_', ' ')} | {r['item_f1']:.3f} | {r['critical_steps']:.2f} | "
                         f"{r['total_steps']:.2f} | {r['subagents']:.2f} | {r['no_spawn_fraction']:.2f} |")
    if "wall_clock_s" in summary:
        lines.append(f"\nwall clock {summary['wall_clock_s']:.0f} s on {summary['device']}, "
                     f"{summary['parl_steps']} PARL steps")
    return "\n".join(lines)


def curves(workdir: str) -> None:
    """curves.png: SFT loss; PARL reward, item-F1, critical steps and sub-agents per step
    (batch means of the training rollouts)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    parl = [r for r in rows if r["stage"] == "parl"]
    sft = [r for r in rows if r["stage"] == "sft"]
    fig, axes = plt.subplots(1, 5, figsize=(20, 3.4))
    axes[0].plot([r["step"] for r in sft], [r["loss"] for r in sft])
    axes[0].set_title("SFT loss")
    for ax, k in zip(axes[1:], ("reward", "item_f1", "critical_steps", "subagents")):
        ax.plot([r["step"] for r in parl], [r[k] for r in parl])
        ax.set_title(f"PARL {k}")
        ax.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(os.path.join(workdir, "curves.png"), dpi=100)
    plt.close(fig)
