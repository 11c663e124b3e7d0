"""The engines a job names (``engine=``, :data:`ENGINES`) and the judge it may wrap them in.

Each name brings an :class:`EngineKind`: how it is built from the job, the task, the
environment context, the model config and the mesh; what it refuses (one line); whether
its policy reads text. ``"host"``: the host-driven text rollout over the task's Python
environments (:class:`~swarmjax.train.engines.HostEngine`); ``"device"``: the jitted swarm
over the task's device twin (:class:`~swarmjax.train.engines.DeviceEngine`); ``"token"``:
the token world's own jitted swarm (:mod:`swarmjax.train.token_world`). A judge reward
wraps any of them (:func:`judged`: :class:`~swarmjax.train.engines.JudgedEngine`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp

from swarmjax.envs.task import EnvContext, check_device_twin, device_twin, make_env, problem_size, problem_text
from swarmjax.models.config import ModelConfig
from swarmjax.models.lora import over_base
from swarmjax.models.hf import from_hf
from swarmjax.rl.judge import Judge, JudgeReward
from swarmjax.roles import Roles
from swarmjax.sampling.processors import SamplingConfig
from swarmjax.swarm.text_rollout import TextRollout
from swarmjax.text.chat import chat_format, detect_chat_format
from swarmjax.traces.text import text_trace
from swarmjax.train import token_world
from swarmjax.train.distributed import local_replica
from swarmjax.train.engines import DeviceEngine, HostEngine, JudgedEngine
from swarmjax.train.parl import PARLTrainConfig
from swarmjax.train.policy import read_tokenizer
from swarmjax.train.sft import SFTConfig

if TYPE_CHECKING:
    from swarmjax.train.agent_job import AgentJob

__all__ = ["ENGINES", "EngineKind", "build_judge", "judged", "text_rollout"]


def build_judge(reward: JudgeReward, cfg: ModelConfig, chat, state: Any, *, mesh=None) -> Judge:
    """The :class:`~swarmjax.rl.judge.Judge` of a job's judge reward: the Hugging Face
    checkpoint ``reward.hf_path`` with its own tokenizer, or the policy's frozen copy in
    ``state.frozen["judge"]`` (copied: the learner's update donates the state's buffers,
    frozen trees included) with the policy's config and chat format. One process: rows
    over ``mesh``; several: each process judges its own episodes with a whole local copy
    (as its rollout decodes with one)."""
    several = jax.process_count() > 1
    rows = None if several else mesh
    if reward.hf_path is None:
        judge = over_base(state.frozen["judge"], state.params)              # LoRA: its adapters over the base
        frozen = local_replica(judge, mesh) if several else judge
        return Judge(reward.judge, cfg, jax.tree.map(jnp.copy, frozen), chat, mesh=rows)
    tokenizer = read_tokenizer(reward.hf_path, what="judge.hf_path")
    judge_cfg, params = from_hf(reward.hf_path)
    judge_chat = chat_format(reward.chat or detect_chat_format(tokenizer), tokenizer)
    return Judge(reward.judge, judge_cfg, params, judge_chat, mesh=rows)


def judged(reward: JudgeReward | None, task: Any, engine: Any, cfg: ModelConfig, state: Any, chat, mesh) -> Any:
    """``engine`` with the judge reward ``reward``, or as is (None)."""
    if reward is None:
        return engine
    judge = build_judge(reward, cfg, chat, state, mesh=mesh)
    return JudgedEngine(engine, judge, reward.mix, lambda p: problem_text(task, p, reference=reward.reference))


def text_rollout(job: AgentJob, cfg: ModelConfig, chat, *, greedy: bool) -> TextRollout:
    """The training rollout, or (``greedy``) the evaluations' one: both roles at temperature 0."""
    rcfg = job.rl.rollout
    if greedy:
        rcfg = dataclasses.replace(rcfg, sampling=Roles.both(SamplingConfig(temperature=0.0)))
    return TextRollout(cfg, rcfg, stop_ids=chat.stop_ids, pad_id=int(chat.ids[chat.pad_token][0]))


def host_engine(job: AgentJob, task: Any, ctx: EnvContext, cfg: ModelConfig, mesh: Any) -> HostEngine:
    """The host-driven rollout over fresh environments of ``task`` (any task): a sampling
    rollout and a greedy one for the evaluations."""
    return HostEngine(text_rollout(job, cfg, ctx.chat, greedy=False), lambda p: make_env(task, p, ctx),
                      greedy_rollout=text_rollout(job, cfg, ctx.chat, greedy=True))


def device_engine(job: AgentJob, task: Any, ctx: EnvContext, cfg: ModelConfig, mesh: Any) -> DeviceEngine:
    """The jitted swarm over ``task``'s device twin (:func:`~swarmjax.envs.task.device_twin`),
    its episodes' rows over ``mesh``'s batch axes, compiled once for a step's episodes
    (training and, greedy with the budget lifted, the evaluations). With several
    processes each rolls out its share of a step's episodes (whole groups) on its first
    device with a local copy of the params, every episode keyed by its index in the step
    (the swarm's ``episode_keys``): the metrics are those of one process."""
    return DeviceEngine.over(device_twin(task, ctx.chat), cfg, job.rl.rollout,
                             episodes=job.rl.tasks_per_step * job.rl.group_size,
                             size=functools.partial(problem_size, task), mesh=mesh, swarm=job.rl.swarm)


def check_text(job: AgentJob, task: Any) -> None:
    """One-line errors for a text job (host or device engine) with the token world's pieces."""
    if isinstance(job.rl, PARLTrainConfig) or isinstance(job.sft, SFTConfig):
        raise ValueError(f"engine={job.engine!r} takes rl=TextRLConfig(...) and sft=TextSFTConfig(...) "
                         "(swarmjax.train.agent); PARLTrainConfig and SFTConfig are the token engine's")


def check_device(job: AgentJob, task: Any) -> None:
    """One-line errors for a device-engine job: a task without a twin, or a setting the
    jitted swarm does not run with."""
    check_text(job, task)
    check_device_twin(task)
    why = [what for what, bad in (
        (f"rl.rollout.context.strategy={job.rl.rollout.context.strategy!r} (the device swarm's sub-agents "
         "are its context management: 'none')", job.rl.rollout.context.strategy != "none"),
        ("subagents='shared' (use 'frozen')", job.role == "orchestrator" and job.subagents == "shared"),
        ("rl.async_rollout.rollout_devices=1 (the swarm decodes over the job's mesh; rollouts ahead of the "
         "learner share its devices: 0)", job.rl.async_rollout.rollout_devices > 0))
        if bad]
    if why:
        raise ValueError(f"engine='device' does not run with {why[0]}; or use engine='host'")


def text_traces(run: Any, label: str, split: str, step: int, log: Any) -> Callable | None:
    """The ``on_result`` of a text job's evaluation (``run``: its
    :class:`~swarmjax.train.agent_job.AgentRun`): the final test evaluation's first call of
    episodes as orchestration traces (:mod:`swarmjax.traces.text`), compactions included,
    and as ATIF trajectories (:mod:`swarmjax.traces.atif`); None for the others."""
    if (label, split) != ("final", "test"):
        return None
    agent = "orchestrator" if run.job.role == "orchestrator" else "agent"     # a single agent by its role

    from swarmjax.text.toolcalls import parse_turn
    from swarmjax.text.tools import ToolSet
    from swarmjax.traces.atif import episode_trajectory

    decode = run.chat.tokenizer.decode
    parse = functools.partial(parse_turn, tools=ToolSet(), syntax=run.chat.call_syntax)   # names and arguments

    def write(res, batch, first):
        for b, p in enumerate(batch if first == 0 else ()):
            size = problem_size(run.task, p)
            tid = f"{label}-s{step}-n{size}-{b}"
            log.write("traces.jsonl", text_trace(res, b, decode, task_size=size, trace_id=tid, task_id=f"test-{b}",
                                                 agent=agent))
            log.write("atif.jsonl", episode_trajectory(res, b, decode, parse=parse, trajectory_id=tid,
                                                       extra={"task_id": f"test-{b}", "task_size": size}))
    return write


@dataclasses.dataclass(frozen=True)
class EngineKind:
    """What a job's engine name brings.

    build: (job, task, env context, model config, mesh) -> the engine its RL steps and
      evaluations call (:mod:`swarmjax.train.engines`).
    check: (job, task) -> None, or a one-line ValueError.
    traces: (run, label, split, step, log) -> an evaluation's ``on_result`` writing its
      traces, or None.
    text: the policy reads text (a tokenizer and a chat format: host, device), or the
      task's own ids (token).
    """

    build: Callable[..., Any]
    check: Callable[[AgentJob, Any], None]
    traces: Callable[..., Callable | None] = text_traces
    text: bool = True


ENGINES: dict[str, EngineKind] = {"host": EngineKind(host_engine, check_text),
                                  "device": EngineKind(device_engine, check_device),
                                  "token": EngineKind(token_world.token_engine, token_world.check,
                                                      traces=token_world.token_traces, text=False)}
