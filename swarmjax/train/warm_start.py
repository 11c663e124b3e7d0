"""A job's warm start as a reusable artifact: ``<workdir>/warm_start/``.

Ablations of the PARL stage (another reward channel, loss, budget...) all start from
the same warm start when the model, the SFT settings, the task and the seed are the
same, and the warm start is most of a CPU run's wall clock. So every ``run_job`` writes
its warm-started params (trained, or reused) next to its checkpoints, and a later job
may start from them (``AgentJob.warm_start_from = <that workdir>``) instead of repeating
the SFT:

* ``warm_start/params/``: the params pytree, orbax ``StandardCheckpointer`` (any mesh,
  local or cloud paths);
* ``warm_start/meta.json``: what produced them (:func:`warm_identity`: the task, the
  policy, the role, the SFT config, the job seed) and what the job reports of its data
  (the token world's held-out per-role SFT accuracy, a text task's demonstration rows).

Loading checks that identity field by field: params trained for another model or on
other demonstrations are refused with one line naming the fields that differ. A job
that means to transfer a warm start to a variant of the task (another worker step
limit, say) narrows the check with ``AgentJob.warm_start_match = ("policy",)``; the
reused warm start keeps the identity it was made with.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
from etils import epath

__all__ = ["check_warm_start", "load_warm_start", "read_warm_params", "save_warm_start", "warm_identity"]

_PARAMS, _META = "params", "meta.json"


def warm_identity(job) -> dict[str, str]:
    """The fields of a job config that determine its warm start, as reprs (its
    ``warm_identity()``: :meth:`~swarmjax.train.agent_job.AgentJob.warm_identity`)."""
    return job.warm_identity()


def _dir(workdir: str | epath.PathLike) -> epath.Path:
    """``<workdir>/warm_start``, absolute (orbax wants absolute paths); gs:// etc. as given."""
    path = epath.Path(workdir) / "warm_start"
    return path if "://" in str(workdir) else epath.Path(os.path.abspath(path))


def save_warm_start(job, workdir: str, params: Any, sft_accuracy: dict[str, float], *,
                    identity: dict[str, str] | None = None) -> None:
    """Write ``params`` and their identity (default :func:`warm_identity` of ``job``; a
    reused warm start passes the identity it was loaded with) to ``<workdir>/warm_start/``
    (all processes call this; process 0 writes the JSON)."""
    import orbax.checkpoint as ocp

    path = _dir(workdir)
    with ocp.StandardCheckpointer() as ckpt:
        ckpt.save(path / _PARAMS, params, force=True)
    if jax.process_index() == 0:
        (path / _META).write_text(json.dumps({"identity": identity or warm_identity(job),
                                              "sft_accuracy": sft_accuracy}, indent=2))


def check_warm_start(job, workdir: str) -> dict[str, Any]:
    """The meta of the warm start the run in ``workdir`` wrote, checked for ``job``
    (reads only: a job's ``validate`` calls it before anything is created). Raises
    ``ValueError`` (one line) when there is none or it was made for another value of one
    of ``job.warm_start_match`` (default: every field of :func:`warm_identity`)."""
    meta_file = _dir(workdir) / _META
    if not meta_file.exists():
        raise ValueError(f"warm_start_from: {workdir} holds no warm start ({meta_file} is missing; "
                         "runs write it once their SFT stage ends)")
    meta = json.loads(meta_file.read_text())
    mine, saved = warm_identity(job), meta.get("identity", {})
    match = getattr(job, "warm_start_match", None) or tuple(mine)
    diff = sorted(k for k in match if mine.get(k) != saved.get(k))
    if diff:
        raise ValueError(f"warm_start_from: the warm start in {workdir} was made with another "
                         f"{', '.join(diff)} (it must match the job's {', '.join(match)})")
    return meta


def load_warm_start(job, workdir: str, abstract_params: Any) -> tuple[Any, dict[str, Any]]:
    """The warm start written by the run in ``workdir``, for ``job``: (params laid out
    as ``abstract_params``, its meta: ``identity`` and the ``sft_accuracy`` it reported),
    checked first (:func:`check_warm_start`)."""
    meta = check_warm_start(job, workdir)
    return read_warm_params(workdir, abstract_params), meta


def read_warm_params(workdir: str, abstract_params: Any) -> Any:
    """The params of the warm start in ``workdir``, laid out as ``abstract_params``,
    unchecked (:func:`load_warm_start` checks them against a job first)."""
    import orbax.checkpoint as ocp

    with ocp.StandardCheckpointer() as ckpt:
        return ckpt.restore(_dir(workdir) / _PARAMS, abstract_params)
