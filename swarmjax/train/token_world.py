"""The token world's pieces of the one job (:mod:`swarmjax.train.agent_job`), for a job
with ``task=WideSearchTokens(...)`` (:mod:`swarmjax.envs.widesearch_token_task`) and
``engine="token"``:

* :func:`check`: what such a job needs (one-line errors): the orchestrator role with
  frozen sub-agents, the token world's RL and warm-start configs, a model whose
  vocabulary holds the world's, batches that split over the mesh and the processes;
* :func:`token_engine`: the jitted token swarm (:class:`~swarmjax.train.engines.TokenEngine`),
  every step's episodes over the mesh as one global batch, its evaluations in calls of one
  task size;
* :func:`token_warm_start`: the reference simulator's demonstrations of both roles
  (:func:`~swarmjax.train.sft.train_sft`, the budget lifted: they are serial-heavy);
* :func:`token_traces`: orchestration traces of the test split's evaluations
  (:func:`~swarmjax.traces.rollout.rollout_traces`: every agent's turns and tool calls,
  each PARL reward channel, the call's measured wall time split over its episodes), and
  the same episodes as ATIF trajectories (:mod:`swarmjax.traces.atif`: their ids and
  log-probs, the world's symbols as the text).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from swarmjax.envs.widesearch import Vocab
from swarmjax.sharding.mesh import MeshConfig, make_mesh
from swarmjax.train.async_rl import split_devices
from swarmjax.train.engines import TokenEngine
from swarmjax.train.logs import log_line, progress_bar
from swarmjax.train.parl import PARLTrainConfig, token_engine_over
from swarmjax.train.sft import SFTConfig, train_sft

__all__ = ["check", "token_engine", "token_traces", "token_warm_start"]

TRACES_PER_CALL = 2       # test-split episodes of each evaluation call (one task size) saved as traces


def check(job: Any, task: Any) -> None:
    """One-line errors for a token-engine job that cannot run (module docstring)."""
    from swarmjax.envs.widesearch_token_task import WideSearchTokens

    if not isinstance(task, WideSearchTokens):
        raise ValueError(f"engine='token' runs the token world's task (task='widesearch-tokens'), not "
                         f"{type(task).__name__}: use engine='host' or 'device'")
    if not isinstance(job.rl, PARLTrainConfig):
        raise ValueError("engine='token' takes rl=PARLTrainConfig(...) (swarmjax.train.parl)")
    if job.sft is not None and not isinstance(job.sft, SFTConfig):
        raise ValueError("engine='token' warm-starts on the reference simulator's demonstrations: "
                         "sft=SFTConfig(...) (swarmjax.train.sft) or None")
    env = task.cfg
    if job.rl.rollout.env is not None and job.rl.rollout.env != env:
        raise ValueError("rl.rollout.env differs from task.cfg: the token engine runs the task's rules; "
                         "leave rl.rollout.env unset")
    if job.role != "orchestrator" or job.subagents != "frozen" or job.judge is not None:
        raise ValueError("engine='token' trains an orchestrator with frozen sub-agents and the task's own "
                         "reward: role='orchestrator', subagents='frozen', judge=None")
    if job.model.vocab_size < (need := Vocab(env).size):
        raise ValueError(f"model.vocab_size {job.model.vocab_size} < the task vocabulary ({need} tokens)")
    per_size = job.eval_episodes // len(task.eval_sizes)
    if job.eval_episodes % len(task.eval_sizes):
        raise ValueError(f"eval_episodes {job.eval_episodes} must be a multiple of the "
                         f"{len(task.eval_sizes)} task.eval_sizes {list(task.eval_sizes)}")
    rl, procs = job.rl, jax.process_count()
    acfg = rl.async_rollout
    if acfg.rollout_devices and rl.batch % acfg.rollout_devices:
        raise ValueError(f"rl.tasks_per_step x rl.group_size = {rl.batch} is not divisible by "
                         f"rl.async_rollout.rollout_devices = {acfg.rollout_devices}")
    if job.mesh is not None:
        job.mesh.check_batches(jax.device_count() - acfg.rollout_devices,
                               {"rl.tasks_per_step x rl.group_size": rl.batch,
                                "eval_episodes per task size": per_size})
        if procs > 1:                     # each process puts its rows on its devices
            data, fsdp, _ = job.mesh.shape(jax.device_count() - acfg.rollout_devices)
            shards = data * fsdp
            if rl.tasks_per_step % shards:
                raise ValueError(f"rl.tasks_per_step={rl.tasks_per_step} does not split over the mesh's "
                                 f"{shards} batch shards (data x fsdp) on {procs} processes: make it a "
                                 f"multiple of {shards}")
    if task.data.train_size < rl.tasks_per_step:
        raise ValueError(f"task.data.train_size {task.data.train_size} < rl.tasks_per_step")


def token_engine(job: Any, task: Any, ctx: Any, cfg: Any, mesh: Any) -> TokenEngine:
    """The token swarm for ``job`` over ``task``'s rules: sampling rollouts on the
    learner's ``mesh`` (or, with ``rl.async_rollout.rollout_devices``, data-parallel over
    those devices of their own) and greedy ones, the budget lifted, in calls of one task
    size's held-out problems."""
    rl = job.rl.bound(task)
    _, rollout_devices = split_devices(rl.async_rollout)
    rollout_mesh = mesh if rollout_devices is None else \
        make_mesh(MeshConfig(data=len(rollout_devices)), rollout_devices)
    return token_engine_over(cfg, rl.rollout, mesh=mesh, rollout_mesh=rollout_mesh,
                             eval_batch=job.eval_episodes // len(task.eval_sizes))


def token_warm_start(run: Any, log: Any, saves: Any) -> tuple[Any, dict[str, float]]:
    """The warm start of a token job's ``run`` (:class:`~swarmjax.train.agent_job.AgentRun`):
    :func:`~swarmjax.train.sft.train_sft` from a model initialised with
    ``fold_in(key(seed), 0)`` on the task's rules with the budget lifted. Returns (params,
    the held-out per-role token accuracy after it); continued from and saved to ``saves``
    (:class:`~swarmjax.train.warm_steps.WarmSteps`), which raises :class:`Preempted` at
    the end of the step where a SIGTERM arrived, once saved."""
    job, scfg = run.job, run.job.sft
    bar = progress_bar(scfg.steps, "warm start (SFT)", run.progress, initial=saves.step or 0)

    def on_sft(i, m):
        log.write("metrics.jsonl", {"stage": "sft", "step": i, **m})
        bar.set_postfix(loss=f"{m['loss']:.3f}", orch_acc=f"{m['orch_acc']:.2f}", worker_acc=f"{m['worker_acc']:.2f}")
        bar.update()
        log_line(run.progress, job.log_every * 10, i, scfg.steps, "warm start", m, ("loss", "orch_acc", "worker_acc"))
    params = run.start_params()
    try:
        warm, report = train_sft(params, run.warm_cfg, dataclasses.replace(run.task.cfg, budget=None), scfg, on_sft,
                                 saves=saves)
    finally:
        bar.close()
    return warm, {k: v for k, v in report["after"].items() if k.endswith("_acc")}


def token_traces(run: Any, label: str, split: str, step: int, log: Any):
    """The ``on_result`` of a test-split evaluation (None for the others): the first
    :data:`TRACES_PER_CALL` episodes of each call (one task size) as orchestration traces,
    with the reward channels as RL step ``step`` would weigh them (the budget lifted), and
    as ATIF trajectories of the same ids (``atif.jsonl``)."""
    from swarmjax.traces.atif import episode_trajectory
    from swarmjax.traces.rollout import rollout_traces
    from swarmjax.train.agent_rl import episode_rewards

    if split != "test":
        return None

    decode = Vocab(run.task.cfg).decode

    def write(res, batch, first):
        reward, channels = episode_rewards(res, run.rl, step)
        n = int(batch[0]["n"])
        for b, tr in enumerate(rollout_traces(run.task.cfg, batch, res, rewards={"reward": reward, **channels},
                                              wall_clock_s=res.stats["seconds"], prefix=f"{label}-s{step}-n{n}",
                                              limit=TRACES_PER_CALL)):
            log.write("traces.jsonl", tr)
            log.write("atif.jsonl", episode_trajectory(res, b, decode, trajectory_id=tr["trace_id"],
                                                       extra={"task_id": tr["task_id"], "task_size": n}))
    return write
