"""The greedy evaluation of every text job: a problem list's episodes on an engine
(:mod:`swarmjax.train.engines`), split over processes, and their figures
(:data:`FIGURES`: accuracy, tool calls, turns, sub-agents, critical steps, context
figures; :data:`JUDGE_FIGURES` with a judge), per episode and as means."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from swarmjax.envs.scoring import item_f1
from swarmjax.envs.task import problem_size, reward_terms
from swarmjax.roles import Roles
from swarmjax.swarm.text_rollout import END_ANSWER, END_CONTEXT, TextRolloutResult
from swarmjax.train.distributed import allgather, local_replica
from swarmjax.train.engines import Engine
from swarmjax.train.logs import change


# the figures of an evaluation and of every RL step
# with a judge: its score, judge - verifier (> 0: it overrates), and whether its verdict
# (score > 0.5) is the verifier's (score > 0.5)
JUDGE_FIGURES = ("judge", "judge_gap", "judge_agreement")
# with an orchestrator whose verifier reports where delegated items went
# (:func:`~swarmjax.envs.widesearch.handoff_counts`): the share of the task's entities it
# assigned to sub-agents, the sub-agents' return item-F1 against what they were assigned,
# and the answer's item-F1 against what came back (nan for an episode without
# assignments or returns; their means skip those)
HANDOFF_FIGURES = ("delegated", "return_f1", "copy_fidelity")
# with a harness task (:mod:`swarmjax.serve.harness_env`): requests served, requests that
# did not extend the stream (edited history), requests refused, and episodes whose harness
# raised or passed its time limit
HARNESS_FIGURES = ("requests", "template_drift", "refused", "harness_error", "timeout")
# with an environment hub's task (:mod:`swarmjax.envs.openenv`, :mod:`swarmjax.envs.verifiers`):
# episodes the environment could not complete (a server error, a failed rollout)
HUB_FIGURES = ("env_error",)
FIGURES = ("accuracy", "tool_calls", "tool_errors", "turns", "answered", "truncated", "context_ended",
           "subagents", "finished_subagents", "no_spawn", "critical_steps", "total_steps", "compactions",
           "context_dropped", "peak_context", "subagent_peak_context")


def evaluate(engine: Engine, params: Roles, problems: list, key: jax.Array, *,
             mesh: Any = None, on_result: Callable[[TextRolloutResult, list, int], None] | None = None
             ) -> dict[str, np.ndarray]:
    """Greedy episodes of ``problems``: :func:`episode_figures` of each [N], in order
    (:func:`mean_figures` averages them). Calls of ``engine.batch`` episodes when it has
    one (the last filled up with repeats of its first problem, dropped from the figures):
    the training rollout's compiled program. With several processes each runs a share
    (episode ``e`` keyed as on one process) and every process gets all the figures
    (``params``: a ``Roles`` of global arrays over ``mesh``). ``on_result(res, problems, first)``: called
    with each call's result, its problems (repeats left out) and the index of its first
    one (e.g. to export traces)."""
    whole = engine.whole_batch     # every process runs every call and gets every row
    procs, n = 1 if whole else jax.process_count(), len(problems)
    per = -(-n // procs)
    start = 0 if whole else min(jax.process_index() * per, n)
    mine = problems[start:start + per]
    figures = {k: np.full((per,), np.nan, np.float32) for k in FIGURES}
    if getattr(engine, "judge", None) is not None:          # a judged engine: its score beside the truth
        figures.update({k: np.full((per,), np.nan, np.float32) for k in JUDGE_FIGURES})
    figures.update({k: np.full((per,), np.nan, np.float32) for k in HANDOFF_FIGURES + HARNESS_FIGURES + HUB_FIGURES})
    local = params if whole else _rollout_params(params, mesh)
    size = engine.batch or max(len(mine), 1)
    for c, at in enumerate(range(0, len(mine), size)):
        call = mine[at:at + size]
        res = engine(local, call + call[:1] * (size - len(call)), jax.random.fold_in(key, c),
                     episode_ids=range(size) if whole else range(start + at, start + at + size), greedy=True)
        for k, v in episode_figures(res).items():
            if k in figures:
                figures[k][at:at + len(call)] = v[:len(call)]
        if on_result is not None:
            on_result(res, call, start + at)
    if not whole:
        figures = allgather(figures)                                   # [procs, per]
    figures = {k: v.reshape(-1)[:n] for k, v in figures.items()}
    return {k: v for k, v in figures.items()
            if k not in HANDOFF_FIGURES + HARNESS_FIGURES + HUB_FIGURES or not np.isnan(v).all()}


def episode_figures(res: TextRolloutResult) -> dict[str, np.ndarray]:
    """Each episode's figures [B] float32 (:data:`FIGURES`): accuracy (the verifier's
    score: item-F1 in wide search; ``r_perf``, or ``r_verifier`` where a judge's reward is
    mixed in, then with :data:`JUDGE_FIGURES`), tool calls and errors, orchestrator turns,
    whether it answered, whether its answer was cut by the turn limit, whether it ran out
    of context; sub-agents started and finished (returned before their turn limit),
    whether it started none (``no_spawn``), critical and total steps; the orchestrator's
    compactions (:mod:`swarmjax.swarm.context`), the ids they took out of its conversation,
    its longest segment (ids), and its sub-agents' longest conversation (0 without any);
    :data:`HANDOFF_FIGURES` where the verifier counts them (nan in an episode without
    returns); :data:`HARNESS_FIGURES` for a harness task's episodes."""
    r = reward_terms(res.rewards, len(res.length))
    out = {"accuracy": r.get("r_verifier", r["r_perf"]), "tool_calls": r["tool_calls"], "tool_errors": r["tool_errors"],
           "turns": res.orch_steps, "answered": res.end_reason == END_ANSWER, "truncated": r["truncated"],
           "context_ended": res.end_reason == END_CONTEXT, "subagents": res.spawned,
           "finished_subagents": res.finished, "no_spawn": res.spawned == 0,
           "critical_steps": res.critical_steps,
           "total_steps": res.total_steps, "compactions": [len(t.segments) for t in res.orchestrators],
           "context_dropped": [t.dropped for t in res.orchestrators],
           "peak_context": [t.peak for t in res.orchestrators],
           "subagent_peak_context": [max([len(t) for t in subs], default=0) for subs in res.subagents]}
    if "judge" in r:                    # a judged engine's episodes: the judge's score and its gap to the truth
        truth = r.get("r_verifier", r["r_perf"])
        out.update(judge=r["judge"], judge_gap=r["judge"] - truth, judge_agreement=(r["judge"] > 0.5) == (truth > 0.5))
    if "sub_truth" in r:                # where the delegated items went
        out["delegated"] = np.where(r["task_entities"] > 0, r["sub_truth"] / np.maximum(r["task_entities"], 1), np.nan)
        for name, term in zip(HANDOFF_FIGURES[1:], ("sub", "copy")):
            truth = r[f"{term}_truth"]
            f1 = item_f1(r[f"{term}_correct"], r[f"{term}_answered"], truth, truth > 0)
            out[name] = np.where(truth > 0, f1, np.nan)
    if "requests" in r:                 # a harness's episodes
        out.update({k: r[k] for k in HARNESS_FIGURES})
    if "env_error" in r:                # an environment hub's episodes
        out.update({k: r[k] for k in HUB_FIGURES})
    keys = (FIGURES + (JUDGE_FIGURES if "judge" in r else ()) + (HANDOFF_FIGURES if "sub_truth" in r else ())
            + (HARNESS_FIGURES if "requests" in r else ()) + (HUB_FIGURES if "env_error" in r else ()))
    return {k: np.asarray(out[k], np.float32) for k in keys}


def by_size(sizes: np.ndarray, per_episode: dict[str, np.ndarray]) -> dict[str, dict[str, float]]:
    """Each figure's mean over the episodes of each problem size ``sizes`` [N]
    (``{str(n): {figure: mean}}``, sizes in increasing order)."""
    sizes = np.asarray(sizes)
    return {str(n): mean_figures({k: v[sizes == n] for k, v in per_episode.items()}) for n in np.unique(sizes)}


def mean_figures(per_episode: dict[str, np.ndarray]) -> dict[str, float]:
    """The mean over episodes of each figure (float32, reduced by XLA as an on-device
    mean is: the token engine's figures are those it reported on the device);
    :data:`HANDOFF_FIGURES` over the episodes that have them, left out when none has (no
    NaN reaches a summary or a checkpoint's metadata)."""
    return {k: float((jnp.nanmean if k in HANDOFF_FIGURES else jnp.mean)(jnp.asarray(v, jnp.float32)))
            for k, v in per_episode.items() if k not in HANDOFF_FIGURES or not np.isnan(v).all()}


def rollout_figures(res: TextRolloutResult) -> dict[str, float]:
    """Means over a rollout's episodes of :func:`episode_figures`."""
    return mean_figures(episode_figures(res))


def _rollout_params(params: Roles, mesh: Any) -> Roles:
    """The local replicas a process's rollout decodes with (:func:`local_replica`); the
    sub-agents' are the orchestrator's when they decode with the trained params (one
    gather, not two)."""
    orch = local_replica(params.orchestrator, mesh)
    same = params.subagents is params.orchestrator
    return Roles(orch, orch if same else local_replica(params.subagents, mesh))


def labelled_figures(label: str, evals: dict) -> dict:
    """An evaluation's figures as the table reads them: ``label`` without the per-size
    rows, ``<label>_sizes`` with them (when the problems have several sizes)."""
    out = {label: {k: v for k, v in evals.items() if k != "sizes"}}
    if evals.get("sizes"):
        out[f"{label}_sizes"] = evals["sizes"]
    return out


def start_figures(meta: dict, split: str, count: int) -> dict:
    """The run's own evaluation of its start (``initial``), on the test split when the
    checkpoint's held-out problems are the ``count`` evaluated ones."""
    if split != "test" or meta.get("held_out", {}).get("test") != count:
        return {}
    return labelled_figures("initial", meta["evals"]["initial"])


def per_size(task: Any, problems: list, episodes: dict[str, np.ndarray]) -> dict[str, dict[str, float]] | None:
    """Each figure's mean over the episodes of each problem size (``task.size(problem)``:
    ``{str(n): {figure: mean}}``); None when the task has no ``size`` method and every
    problem has one size."""
    sizes = np.asarray([problem_size(task, p) for p in problems])
    sized = callable(getattr(task, "size", None))
    return by_size(sizes, episodes) if sized and len(problems) or len(set(sizes.tolist())) > 1 else None


# the per-size table's columns: what a size changes
SIZE_FIGURES = ("accuracy", "answered", "subagents", "no_spawn", "critical_steps", "total_steps")

_HIGHER_IS_BETTER = {"accuracy": True, "answered": True, "tool_errors": False, "truncated": False,
                     "context_ended": False}


def agent_summary_table(summary: dict) -> str:
    """The start/end table of an agent job's summary (markdown; the rows it has), with a
    verdict per figure that has a better direction ("better", "worse", "same")."""
    names = [n for n in ("initial", "final") if n in summary]
    keys = FIGURES + tuple(k for k in JUDGE_FIGURES + HANDOFF_FIGURES + HARNESS_FIGURES + HUB_FIGURES
                           if any(k in summary[n] for n in names))
    rows = ["| policy | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for name in names:
        rows.append(f"| {name} | " + " | ".join(f"{summary[name].get(k, float('nan')):.3f}" for k in keys) + " |")
    if len(names) == 2:
        rows.append("\n" + "; ".join(change(k, summary["initial"].get(k, 0.0), summary["final"].get(k, 0.0),
                                            higher_is_better=up) for k, up in _HIGHER_IS_BETTER.items()))
    sized = [n for n in ("initial", "final") if f"{n}_sizes" in summary]
    if sized:
        sizes = sorted({int(k) for n in sized for k in summary[f"{n}_sizes"]})
        cols = [f"{n} {k}" for k in SIZE_FIGURES for n in sized]
        rows.append("\nper task size (test split):\n\n| n | " + " | ".join(cols) + " |\n" + "|---" * (len(cols) + 1) + "|")
        for size in sizes:
            cells = [summary[f"{n}_sizes"].get(str(size), {}).get(k) for k in SIZE_FIGURES for n in sized]
            rows.append(f"| {size} | " + " | ".join("-" if c is None else f"{c:.3f}" for c in cells) + " |")
        if len(sized) == 2:                     # how each size moved, in words
            a, b = summary["initial_sizes"], summary["final_sizes"]
            rows.append("\n" + "\n".join(
                f"n = {size}: " + change("accuracy", a[str(size)]["accuracy"], b[str(size)]["accuracy"],
                                         higher_is_better=True) + "; "
                + change("critical steps", a[str(size)]["critical_steps"], b[str(size)]["critical_steps"],
                         higher_is_better=False, digits=2)
                for size in sizes if str(size) in a and str(size) in b))
    held = ", ".join(f"{n} {s}" for s, n in summary.get("held_out", {}).items())
    rows.append(f"\nheld-out problems: {held}; greedy; {summary['rl_steps']} RL steps; "
                f"wall clock {summary['wall_clock_s']:.0f} s on {summary['backend']}")
    return "\n".join(rows)
