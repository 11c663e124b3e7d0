"""``swarmjax train`` for any text task: a task plug-in, a policy from a Hugging Face
checkpoint or a small random model, an optional warm start, then GRPO/GSPO on
host-driven text rollouts (single agent, or an orchestrator with sub-agents).

    swarmjax train --config configs/arith_tools_cpu.py --workdir runs/arith
    swarmjax train --config examples/units/config.py --workdir runs/units --set role=orchestrator

1. **Task** (:mod:`swarmjax.envs.task`): a built-in name, an import path or an object.
2. **Policy** (:mod:`swarmjax.train.policy`): ``hf_path`` (weights and tokenizer),
   ``tokenizer_path``, or the CPU default (a BPE trained on the task's corpus and a random
   model); the chat format from the tokenizer's template or ``chat``.
3. **Warm start** (``sft``, optional): the task's demonstrations played through its
   environments, masked next-token loss on every agent's own ids
   (:func:`swarmjax.train.agent.warm_start`).
4. **RL** (:func:`swarmjax.train.agent_rl.rl_step`): ``tasks_per_step`` problems of the
   task's train stream x ``group_size`` rollouts per step; sub-agents frozen (a copy of
   the policy RL starts from, in the checkpoints) or shared (co-trained).
5. **Evaluation** (greedy): on the **validation** split at the start, every
   ``eval_every`` steps and at the end (the best checkpoint is chosen by its accuracy);
   on the **test** split at the start and the end (the summary's table).
   ``metrics.jsonl``, ``eval.jsonl``, ``summary.json`` / ``summary.md``, TensorBoard
   events, ``traces.jsonl`` (orchestration traces of the final test evaluation's first
   batch of episodes, compactions included: :mod:`swarmjax.traces.text`); a log line
   every ``log_every`` steps when progress bars are off.
6. **Meshes and processes** (``mesh``): the warm start and the learner's state sharded
   over a ``(data, fsdp, tensor)`` mesh; with several processes (``swarmjax train
   --coordinator ...``) each rolls out its share of a step's problems (whole groups,
   its tools run locally) with a copy of the params, the learner updates on the global
   batch, and process 0 writes the logs. Each episode's tokens are keyed by its index
   in the step, so the metrics are those of one process.
7. **Checkpoints, resume, preemption**: a checkpoint at RL step 0, at every evaluation,
   on SIGTERM and at the end, with the task stream's state; ``--resume auto`` /
   ``latest`` continue exactly (the logs cut back, the stream restored).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from swarmjax.envs.task import ROLES, EnvContext, make_env, resolve_task, task_name
from swarmjax.models.config import LoraConfig, ModelConfig
from swarmjax.models.hf import hf_config
from swarmjax.models.lora import bare, frozen_part, init_lora, over_base
from swarmjax.models.transformer import init_params
from swarmjax.rl.judge import JudgeReward, judge_corpus
from swarmjax.rl.update import Learner
from swarmjax.sharding.mesh import MeshConfig, make_mesh
from swarmjax.swarm.context import check_env
from swarmjax.text.runner import ToolRunner
from swarmjax.train import token_world
from swarmjax.train.agent import SUBAGENTS, TextRLConfig, TextSFTConfig, demonstrations, mix_context, warm_start
from swarmjax.train.demos import Demos, row_shares
from swarmjax.train.agent_eval import (agent_summary_table, evaluate, labelled_figures, mean_figures, per_size,
                                       start_figures)
from swarmjax.train.agent_rl import rollout_params
from swarmjax.train.async_rl import logged_update, split_devices
from swarmjax.train.distributed import check_processes, primary_first
from swarmjax.train.engines import HostEngine
from swarmjax.train.frame import CheckpointConfig
from swarmjax.train.job_engines import ENGINES, judged, text_rollout
from swarmjax.train.logs import JobLog, curves, log_line, progress_bar, say, write_summary
from swarmjax.train.loop import JobRun, check_split, open_checkpoint
from swarmjax.train.parl import PARLTrainConfig
from swarmjax.train.policy import PolicySource, prepare_policy
from swarmjax.train.warm_steps import WarmSteps
from swarmjax.train.sft import SFTConfig
from swarmjax.train.streams import held_out, task_stream
from swarmjax.train.warm_start import check_warm_start, load_warm_start, save_warm_start

__all__ = ["AgentJob", "AgentRun", "agent_summary_table", "evaluate_agent_checkpoint", "labelled_figures"]


@dataclasses.dataclass(frozen=True)
class AgentJob:
    """A text agent job (module docstring).

    task: a built-in task name, ``"package.module:Name"`` or a task object.
    hf_path, tokenizer_path, chat, tokenizer_vocab, model: the policy
      (:class:`~swarmjax.train.policy.PolicySource`).
    role: "single" or "orchestrator" (``create_subagent`` / ``assign_task``, at most
      ``max_subagents`` assignments an episode; sub-agents have the task's tools).
    subagents: "frozen" (a copy of the policy RL starts from) or "shared" (co-trained).
    judge: an LLM judge's reward (:class:`~swarmjax.rl.judge.JudgeReward`; the judge a
      frozen copy of the policy RL starts from) mixed into training rewards; evaluations
      keep the verifier's accuracy and log the judge's score beside it (None: the
      verifier alone).
    sft: the warm start (None: RL starts from the policy as loaded).
    eval_episodes: problems of each held-out split (fewer when a dataset has fewer).
    log_every: RL steps between log lines when progress bars are off.
    tool_timeout_s: a tool call running longer gets an error reply.
    mesh: the learner's ``(data, fsdp, tensor)`` mesh (None: one device; needed with
      several processes).
    engine: what rolls the episodes out (:data:`ENGINES`): "host" (the host-driven
      rollout, any task's Python tools), "device" (the jitted swarm over the task's
      device twin, ``device_task(chat)``: orchestrator and sub-agents decode in one XLA
      program, the episodes' rows over the mesh's batch axes) or "token" (the token
      world's own jitted swarm, for ``task="widesearch-tokens"``: its ``sft`` an
      :class:`~swarmjax.train.sft.SFTConfig`, its ``rl`` a
      :class:`~swarmjax.train.parl.PARLTrainConfig`; :mod:`swarmjax.train.token_world`).
    seed: the tokenizer's, the model's, the warm start's and the held-out problems'.
    rl_seed: the RL stage's problems and sampling (None: ``seed``): RL seeds over one warm
      start (with ``warm_start_from``).
    warm_start_from: a workdir whose warm start (``<workdir>/warm_start``, which every
      run with ``sft`` writes) this run starts RL from instead of its own; it must have
      been made with the same :meth:`warm_identity`.
    warm_start_match: the :meth:`warm_identity` fields that must match for that (None:
      all of them): ``("policy",)`` transfers a warm start to a variant of the task.
    checkpoint: how often RL checkpoints and how many are kept (None: at every evaluation
      and preemption, the last two and the best kept).
    lora: train low-rank adapters over the frozen policy (:class:`~swarmjax.models.config.LoraConfig`:
      rank, alpha, dropout, targets, the adapters' optimizer), in the warm start and in RL, or
      (``lora.warm_start=False``) in RL over the model a full warm start made (None: the
      whole model throughout). Frozen copies (sub-agents, KL reference, judge) are then the
      adapters alone over the one base the trained policy decodes with
      (:func:`~swarmjax.models.lora.over_base`); checkpoints hold the adapters.
    """

    task: Any = "arith"
    hf_path: str | None = None
    tokenizer_path: str | None = None
    chat: str | None = None
    tokenizer_vocab: int = 1024
    model: ModelConfig = PolicySource.model          # the random model's shape (without hf_path)
    role: str = "single"
    subagents: str = "frozen"
    max_subagents: int = 4
    sft: TextSFTConfig | SFTConfig | None = TextSFTConfig()
    rl: TextRLConfig | PARLTrainConfig = TextRLConfig()
    eval_episodes: int = 128
    eval_every: int = 20
    log_every: int = 10
    tool_timeout_s: float = 10.0
    mesh: MeshConfig | None = None
    judge: JudgeReward | None = None
    lora: LoraConfig | None = None
    engine: str = "host"
    seed: int = 0
    rl_seed: int | None = None
    warm_start_from: str | None = None
    warm_start_match: tuple[str, ...] | None = None
    checkpoint: CheckpointConfig | None = None

    def policy(self) -> PolicySource:
        return PolicySource(hf_path=self.hf_path, tokenizer_path=self.tokenizer_path, chat=self.chat,
                            tokenizer_vocab=self.tokenizer_vocab, model=self.model)

    def identity(self) -> dict[str, str]:
        """What a run computes, as reprs: a run may be resumed with another RL step count,
        evaluation or log cadence, mesh or warm-start source (the same warm start, by its
        identity check), not with another task, policy, warm start, RL configuration, seed
        or held-out set."""
        same = dataclasses.replace(self, rl=dataclasses.replace(self.rl, steps=0), eval_every=0, log_every=0,
                                   task=task_name(resolve_task(self.task)), mesh=None, warm_start_from=None)
        # no judge, the host engine, no RL seed of its own: left out, so runs saved before those fields resume
        unset = {"judge": self.judge is None, "lora": self.lora is None, "engine": self.engine == "host",
                 "rl_seed": self.rl_seed is None,
                 "warm_start_from": True, "warm_start_match": True, "checkpoint": True}
        return {f.name: repr(getattr(same, f.name)) for f in dataclasses.fields(same) if not unset.get(f.name)}

    def warm_identity(self) -> dict[str, str]:
        """What determines the warm start (:mod:`swarmjax.train.warm_start`), as reprs: the
        task, the policy, the role and the SFT config, the seed."""
        lora = self.lora is not None and self.lora.warm_start          # a LoRA warm start
        return {"task": repr(self.task), "policy": repr(self.policy()), "role": repr(self.role),
                "sft": repr(self.sft), "seed": repr(self.seed), **({"lora": repr(self.lora)} if lora else {})}

    def validate(self) -> None:
        """One-line errors for a config that cannot run (the policy's paths read, nothing
        written), before anything is created or compiled."""
        task = resolve_task(self.task)
        if self.judge is not None and self.judge.reference and not callable(getattr(task, "reference", None)):
            raise ValueError(f"judge.reference=True: task {task_name(task)} has no reference(problem) method "
                             "to show the judge")
        self.policy().check()
        if self.role not in ROLES:
            raise ValueError(f"unknown role {self.role!r}; known: {', '.join(ROLES)}")
        if self.subagents not in SUBAGENTS:
            raise ValueError(f"unknown subagents {self.subagents!r}; known: {', '.join(SUBAGENTS)}")
        if self.eval_episodes < 1 or self.eval_every < 0 or self.log_every < 0 or self.max_subagents < 1:
            raise ValueError("eval_episodes and max_subagents must be >= 1, eval_every and log_every >= 0")
        if self.tool_timeout_s <= 0:
            raise ValueError(f"tool_timeout_s must be > 0, got {self.tool_timeout_s}")
        if self.lora is not None:
            from swarmjax.optim.muon import OPTIMIZERS

            if self.lora.optimizer is not None and self.lora.optimizer not in OPTIMIZERS:
                raise ValueError(f"lora.optimizer {self.lora.optimizer!r}: one of {', '.join(OPTIMIZERS)}, or None "
                                 "for the job's own")
            self.lora.check(self.policy().model if self.hf_path is None else hf_config(self.hf_path))
        if self.engine not in ENGINES:
            raise ValueError(f"unknown engine {self.engine!r}; known: {', '.join(ENGINES)}")
        ENGINES[self.engine].check(self, task)
        if self.warm_start_match is not None and not set(self.warm_start_match) <= set(self.warm_identity()):
            raise ValueError(f"warm_start_match {self.warm_start_match} may name only "
                             f"{', '.join(self.warm_identity())}")
        procs = jax.process_count()
        self.rl.async_rollout.check(jax.device_count(), procs)
        if self.mesh is not None and self.rl.async_rollout.rollout_devices:   # the learner's devices: the rest
            self.mesh.shape(jax.device_count() - self.rl.async_rollout.rollout_devices)
        check_processes(self.mesh, ("rl.tasks_per_step", self.rl.tasks_per_step), [
            ("subagents='frozen' or one process (subagents='shared': its sub-agent rows differ in number between "
             "processes)", self.role == "orchestrator" and self.subagents == "shared"),
            ("rl.swarm.episode_keys=True (each process samples its episodes as one process would)",
             self.engine == "device" and not self.rl.swarm.episode_keys)])
        if self.warm_start_from is not None:
            if self.sft is None:
                raise ValueError("warm_start_from reuses a warm start made with this job's sft config: set sft too")
            check_warm_start(self, self.warm_start_from)
        refresh = self.rl.refresh_subagents
        if refresh.enabled and (self.role != "orchestrator" or self.subagents != "frozen"):
            raise ValueError("rl.refresh_subagents replaces frozen sub-agents: it needs role='orchestrator' and "
                             "subagents='frozen'")
        if self.lora is not None and self.lora.subagents == "base" and (
                self.role != "orchestrator" or self.subagents != "frozen" or refresh.enabled):
            raise ValueError("lora.subagents='base' decodes frozen sub-agents with the bare base: it needs "
                             "role='orchestrator', subagents='frozen' (shared sub-agents train the adapters) and "
                             "no rl.refresh_subagents (a refresh copies the adapters)")
        if self.role == "orchestrator" and self.subagents == "shared" and _context(self, "summarizer") == "frozen":
            raise ValueError("rl.rollout.context.summarizer='frozen' decodes with the sub-agents' params, which "
                             "subagents='shared' trains: use subagents='frozen' or summarizer='policy'")


def _state_shapes(job: AgentJob, learner: Learner, cfg: ModelConfig) -> Any:
    """The RL state's shapes: the policy, its optimizer state, the frozen trees (:func:`_frozen`)."""
    return jax.eval_shape(lambda: learner.init(p := init_params(cfg, jax.random.key(0)), _frozen(job, p)))


def _frozen(job: AgentJob, params: Any) -> dict | None:
    """The frozen trees of the RL state: a copy of ``params`` for frozen sub-agents and a
    frozen summariser (``rl.rollout.context.summarizer="frozen"``), and one for the judge."""
    frozen = {}
    copy = lambda: jax.tree.map(jnp.copy, frozen_part(params))      # LoRA: the adapters alone, over one base
    if job.role == "orchestrator" and job.subagents == "frozen" or _context(job, "summarizer") == "frozen":
        frozen["subagents"] = copy() if job.lora is None or job.lora.subagents == "snapshot" else \
            {"lora": bare(params["lora"])}
    if job.judge is not None and job.judge.hf_path is None:
        frozen["judge"] = copy()
    if job.rl.update.loss.kl_beta > 0:                  # the KL term's reference: the policy RL starts from
        frozen["reference"] = copy()
    return frozen or None


def _context(job: AgentJob, field: str) -> str | None:
    """``field`` of the rollout's context management (``rl.rollout.context``: its
    ``strategy``, its ``summarizer``); None for a rollout without it (the token engine's)."""
    context = getattr(job.rl.rollout, "context", None)
    return None if context is None else getattr(context, field)


class AgentRun(JobRun):
    """The job's pieces for the one loop (:func:`~swarmjax.train.loop.run_loop`): the
    task (its data prepared by process 0 first, when it has some to build), the policy
    (process 0 writes the tokenizer and ``policy.json`` first; the token engine's reads
    the task's own ids), the learner on the job's mesh, the task's train stream, the
    engine, the held-out splits."""

    stage, title, start_label, start_splits = "rl", "RL", "initial", ("validation", "test")
    may_change = "rl.steps, eval_every, log_every, mesh, checkpoint and warm_start_from"
    # an evaluation may change the RL settings (e.g. the context strategy), not the policy or the problems
    checked = ("task", "hf_path", "tokenizer_path", "chat", "tokenizer_vocab", "model", "role", "seed")
    table = staticmethod(lambda summary: agent_summary_table(summary))

    @staticmethod
    def checkpointing(job: AgentJob) -> CheckpointConfig:
        return JobRun.checkpointing(job) if job.checkpoint is None else job.checkpoint

    def __init__(self, job: AgentJob, workdir: str, *, fresh: bool = True, progress: bool = True):
        self.job, self.workdir = job, workdir
        self.progress = progress
        self.primary = jax.process_index() == 0
        self.kind = ENGINES[job.engine]
        task = resolve_task(job.task)
        prepare = getattr(task, "prepare", None)
        if callable(prepare):                     # its data built (or found) by process 0 first
            task = primary_first("swarmjax-task-data", lambda: prepare(workdir, progress=progress),
                                 lambda: prepare(workdir, progress=False))
        self.task = task
        if self.kind.text:
            corpus = getattr(task, "corpus", None)
            if corpus is not None and job.judge is not None and job.judge.hf_path is None:  # the judge's words
                corpus = functools.partial(lambda own: own() + judge_corpus(job.judge.judge), corpus)
            # process 0 writes the tokenizer and policy.json first
            cfg, self.params, chat = primary_first(
                "swarmjax-agent-policy", lambda: prepare_policy(job.policy(), workdir, fresh=fresh, corpus=corpus),
                lambda: prepare_policy(job.policy(), workdir, fresh=fresh, corpus=corpus, write=False))
        else:                                     # the task's own ids: the model as configured
            cfg, self.params, chat = job.model, None, None
        # LoRA: adapters over the frozen policy (fresh: they add nothing yet); a full warm start
        # trains the model as loaded (warm_cfg), and RL adapts what it made
        self.warm_cfg = cfg
        if job.lora is not None:
            cfg = cfg.replace(lora=job.lora)
            if job.lora.warm_start or job.sft is None:
                self.warm_cfg = cfg
                if self.params is not None:
                    self.params = self.with_adapters(self.params, cfg)
        self.cfg, self.chat = cfg, chat
        say(f"policy: {cfg.num_params() / 1e6:.2f}M parameters, {cfg.vocab_size} ids"
            f"{'' if chat is None else ', chat format ' + chat.name}{'' if job.hf_path is None else ', from ' + job.hf_path}"
            f"; task {type(task).__name__}, role {job.role}, engine {job.engine}")
        self.key = jax.random.key(job.seed)
        self.rl_seed = job.seed if job.rl_seed is None else job.rl_seed
        self.rl_key = jax.random.key(self.rl_seed)
        self.mesh = None if job.mesh is None else make_mesh(job.mesh, split_devices(job.rl.async_rollout)[0])
        self.learner = Learner(cfg, logged_update(job.rl.update, job.rl.async_rollout), mesh=self.mesh)
        self.rl, self.subagents, self.identity = job.rl.bound(task), job.subagents, job.identity()
        self.eval_every, self.log_every = job.eval_every, job.log_every
        self.steps = self.rl.steps
        self.checkpoint_every = 0 if job.checkpoint is None else job.checkpoint.every
        self.warm_every, self.warm_identity = self.checkpointing(job).warm_every, job.warm_identity()
        self.log_keys = ("reward", "accuracy", "critical_steps" if job.role == "orchestrator" else "tool_calls",
                         "subagents")
        self.stream = task_stream(task, "train", self.rl_seed)
        self.runner = ToolRunner([], max_workers=16, timeout_s=job.tool_timeout_s)
        contexts = getattr(job.rl.rollout, "contexts", None)
        self.ctx = EnvContext(chat, self.runner, role=job.role, max_subagents=job.max_subagents,
                              summarize=_context(job, "strategy") == "summary",
                              context=None if contexts is None else contexts.orchestrator)
        self.engine = self.kind.build(job, task, self.ctx, cfg, self.mesh)
        self.splits = {s: held_out(task, s, job.seed, job.eval_episodes) for s in ("validation", "test")}
        if _context(job, "strategy") is not None:
            check_env(job.rl.rollout.context.strategy, make_env(task, self.splits["validation"][0], self.ctx),
                      summarizer=job.rl.rollout.context.summarizer)

    def state_shapes(self) -> Any:
        return _state_shapes(self.job, self.learner, self.cfg)

    def with_adapters(self, params: Any, cfg: ModelConfig | None = None) -> Any:
        """``params`` (without adapters) with fresh ones (:func:`~swarmjax.models.lora.init_lora`)."""
        return {**params, "lora": init_lora(cfg or self.cfg, jax.random.fold_in(jax.random.key(self.job.seed), 7))}

    def full_warm_start(self) -> bool:
        """Whether the warm start trains the whole model and RL then adapts it (``lora.warm_start=False``)."""
        return self.job.lora is not None and not self.job.lora.warm_start and self.job.sft is not None

    def start_params(self) -> Any:
        """The params the warm start (or RL without one) starts from, of :attr:`warm_cfg`:
        the policy as loaded, else the seed's random model (the token world's warm start:
        its own key)."""
        if self.params is not None:
            return self.params
        token_sft = not self.kind.text and self.job.sft is not None
        return init_params(self.warm_cfg, jax.random.fold_in(self.key, 0) if token_sft else self.key)

    def lora_base(self) -> Any | None:
        """With ``lora``, the frozen base every step trains over, laid out as the learner
        lays out params: :meth:`start_params` without the adapters, or after a full warm
        start the model it made (``<workdir>/warm_start``); else None."""
        if self.job.lora is None:
            return None
        if self.full_warm_start():
            base = jax.eval_shape(lambda: init_params(self.warm_cfg, self.key))
            return load_warm_start(self.job, self.job.warm_start_from or self.workdir, base)[0]
        return {k: v for k, v in self.start_params().items() if k != "lora"}

    def start(self, log: JobLog, saves: WarmSteps) -> tuple[Any, dict]:
        """The warm start (``job.sft``: :data:`WARM_STARTS`, continued from and saved to
        ``saves``, or the one ``warm_start_from`` names) from the policy as loaded, or a
        random model."""
        job, clock = self.job, time.perf_counter()
        meta = {"job": self.identity, "warm_start_s": 0.0, "rl_seed": self.rl_seed,
                "held_out": {s: len(p) for s, p in self.splits.items()}}
        if job.lora is not None:            # the checkpoints hold the adapters: what they adapt (export reads it)
            meta["lora"] = {"config": job.lora.to_json(),
                            "hf_path": job.hf_path, "seed": job.seed, "warm_start": self.full_warm_start()}
        identity = None                     # a reused warm start keeps the identity it was made with
        if job.warm_start_from is not None:
            say(f"warm start: reusing the one in {job.warm_start_from}")
            params, warm = load_warm_start(job, job.warm_start_from,
                                           jax.eval_shape(lambda: init_params(self.warm_cfg, self.key)))
            meta["warm_start_data"], identity = warm.get("sft_accuracy") or None, warm["identity"]
        elif job.sft is None:
            params = self.start_params()
        else:
            params, meta["warm_start_data"] = WARM_STARTS[type(job.sft)](self, log, saves)
            meta["warm_start_s"] = time.perf_counter() - clock
        full = self.full_warm_start()
        if full:                   # RL adapts the warm-started model
            params = self.with_adapters(params)
        state = self.learner.init(params, _frozen(job, params))
        if job.sft is not None:    # every run's workdir holds its warm start, laid out on the learner's mesh
            warm = {k: v for k, v in state.params.items() if k != "lora"} if full else state.params
            save_warm_start(job, self.workdir, warm, meta["warm_start_data"], identity=identity)
        return state, meta

    def ready(self, state: Any, meta: dict) -> None:
        """The judge (a frozen copy in the state, or its own checkpoint) joins the engine."""
        self.engine = judged(self.job.judge, self.task, self.engine, self.cfg, state, self.chat, self.mesh)

    def rl_step(self, state: Any, step: int) -> tuple[Any, dict]:
        state, m = super().rl_step(state, step)
        return state, _tok_s(m)

    def async_step(self, rollouts: Any, state: Any) -> tuple[Any, dict]:
        state, m = super().async_step(rollouts, state)
        return state, _tok_s(m)

    def evaluate(self, step: int, label: str, state: Any, split: str, log: JobLog) -> dict:
        """Greedy episodes of the held-out ``split`` (the engine's traces, ``EngineKind.traces``);
        with problems of several sizes, each figure per size too (``sizes``)."""
        task, problems = self.task, self.splits[split]
        if label in ("initial", "final"):
            say(f"evaluating the {'start' if label == 'initial' else 'final policy'} on {len(problems)} "
                f"{split} problems (greedy)")
        traces = self.kind.traces(self, label, split, step, log) if self.primary else None
        episodes = evaluate(self.engine, rollout_params(state), problems,
                            jax.random.fold_in(self.key, 1), mesh=self.mesh, on_result=traces)
        res = mean_figures(episodes)
        by = per_size(task, problems, episodes)
        log.write("eval.jsonl", {"step": step, "policy": label, "split": split, **res,
                                 **({"sizes": by} if by else {})})
        return {**res, "sizes": by} if by else res

    def score(self, evals: dict) -> dict[str, float]:
        return {"accuracy": evals["accuracy"]}

    def start_state(self, state: Any) -> Any | None:
        """The policy RL started from, when the state keeps it: frozen sub-agents that no
        refresh replaced."""
        job = self.job
        kept = job.role == "orchestrator" and job.subagents == "frozen" and not job.rl.refresh_subagents.enabled
        return state.replace(params=over_base(state.frozen["subagents"], state.params)) if kept else None

    def report(self, step: int, start: dict | None, final: dict, meta: dict, split: str, seconds: float) -> dict:
        """The checkpoint's figures and the start's (:meth:`start_state` evaluated, or on the
        run's own test problems its evaluation of it)."""
        first = labelled_figures("initial", start) if start is not None else \
            start_figures(meta, split, len(self.splits[split]))
        return {**labelled_figures("final", final), **first,
                "held_out": {split: len(self.splits[split])}, "rl_steps": step, "wall_clock_s": seconds,
                "backend": jax.default_backend()}

    def postfix(self, m: dict) -> dict[str, str]:
        out = {"reward": f"{m['reward']:.3f}", "acc": f"{m['accuracy']:.3f}"}
        if self.job.role == "orchestrator":
            out.update(crit=f"{m['critical_steps']:.1f}", subagents=f"{m['subagents']:.2f}")
        return {**out, **({"tok_s": f"{m['tok_s']:.0f}"} if "tok_s" in m else {})}

    def summary(self, meta: dict, wall_clock_s: float) -> dict:
        job, evals = self.job, meta["evals"]
        summary = {"task": task_name(self.task) if self.kind.text else type(self.task).__name__, "role": job.role,
                   "seed": job.seed, "rl_seed": self.rl_seed,
                   "subagents": job.subagents if job.role != "single" else None, "engine": job.engine,
                   "model_params": self.cfg.num_params(), "vocab_size": self.cfg.vocab_size,
                   "chat": None if self.chat is None else self.chat.name,
                   "held_out": meta["held_out"], "rl_steps": meta["step"],
                   "warm_start_steps": 0 if job.sft is None else job.sft.steps,
                   **labelled_figures("initial", evals["initial"]),
                   **labelled_figures("final", evals.get("final", evals["initial"])), "wall_clock_s": wall_clock_s,
                   "warm_start_s": meta["warm_start_s"], "warm_start_data": meta.get("warm_start_data"),
                   "backend": jax.default_backend(), "device": jax.devices()[0].device_kind}
        if self.primary:
            curves(self.workdir, self.log_keys)
            write_summary(self.workdir, summary, agent_summary_table)
        return summary

    def close(self) -> None:
        self.runner.close()
        self.engine.close()


def _tok_s(m: dict) -> dict:
    """``m`` with ``tok_s`` (sampled tokens a second of the rollout) when it counts them."""
    if "sampled_tokens" not in m or "rollout_s" not in m:
        return m
    return {**m, "tok_s": m["sampled_tokens"] / max(m["rollout_s"], 1e-9)}


def warm_start_demos(run: AgentRun) -> Demos | tuple[Demos, Demos]:
    """The rows a text job's warm start trains on (:func:`text_warm_start`): the task's
    demonstrations for the job's role and ``sft.mix`` (the task's ``demonstration_set``
    when it has one, else its demonstrations of the train stream's first problems, or
    with an RL seed of its own the seed's stream's), played through its environments;
    the orchestrator's and the sub-agents' apart with ``sft.per_role``."""
    job, task, ctx = run.job, run.task, run.ctx
    stream = run.stream if job.rl_seed is None else task_stream(task, "train", job.seed)
    rng, scfg = np.random.default_rng(job.seed), job.sft
    say(f"warm start: playing {scfg.demos} demonstrations of {type(task).__name__} through its environments")
    own = getattr(task, "demonstration_set", None)
    scripts = own(scfg.demos, job.seed, ctx.chat) if callable(own) else None
    problems = stream.take(scfg.demos) if scripts is None else [p for p, _ in scripts] if scfg.mix else []
    data = demonstrations(task, problems, ctx, rng, job.rl.rollout, mix=[mix_context(w, ctx) for w in scfg.mix],
                          overlong=scfg.overlong, scripts=scripts, per_role=scfg.per_role, shares=scfg.shares)
    if data is None:
        raise ValueError(f"the warm start needs demonstrations: task {task_name(task)} gives none for role "
                         f"{job.role!r}; set sft=None to start RL from the policy as loaded")
    return data


def text_warm_start(run: AgentRun, log: JobLog, saves: WarmSteps) -> tuple[Any, dict[str, int]]:
    """The warm start of a text job's ``run`` from the policy as loaded (or a random
    model): :func:`warm_start_demos`, then :func:`warm_start` (continued from and saved to
    ``saves``): (params, the demonstrations' ``rows`` and ``skipped_demos``); raises
    :class:`Preempted` at the end of the SFT step where a SIGTERM arrived, once saved."""
    job, scfg = run.job, run.job.sft
    params = run.start_params()
    data = warm_start_demos(run)
    first = data[0] if scfg.per_role else data
    counts = {"rows": len(first) + (len(data[1]) if scfg.per_role else 0), "skipped_demos": first.skipped,
              **row_shares(data if scfg.per_role else (data,))}
    say("warm start rows: " + ", ".join(f"{k.removeprefix('rows_')} {v}" for k, v in counts.items()
                                        if k.startswith("rows_")) + (
        "; batch shares " + ", ".join(f"{k} {v:.2f}" for k, v in scfg.shares) if scfg.shares else ""))
    if first.skipped:
        say(f"warm start: {first.skipped} demonstrations longer than their context left out "
            f"(sft.overlong='skip'); {counts['rows']} rows")
    bar = progress_bar(scfg.steps, "warm start", run.progress, initial=saves.step or 0)
    acc = "orch_acc" if scfg.per_role else "agent_acc"           # teacher-forced tokens

    def on_sft(i, m):
        log.write("metrics.jsonl", {"stage": "sft", "step": i, **m})
        bar.update(1)
        bar.set_postfix(loss=f"{m['loss']:.3f}", tok_acc=f"{m[acc]:.3f}")
        log_line(run.progress, job.log_every * 10, i, scfg.steps, "warm start", m,
                 ("loss", "orch_acc", "worker_acc") if scfg.per_role else ("loss", "agent_acc"))
    try:
        params = warm_start(params, run.warm_cfg, data, scfg, job.seed, on_sft, mesh=run.mesh, saves=saves)
    finally:
        bar.close()
    return params, counts


# the sft config's type -> (run, log, saves) -> (warm-started params, what the summary reports of its data)
WARM_STARTS: dict[type, Callable[..., tuple[Any, dict]]] = {TextSFTConfig: text_warm_start,
                                                            SFTConfig: token_world.token_warm_start}


def evaluate_agent_checkpoint(job: AgentJob, workdir: str, *, which: str = "latest", split: str = "test",
                              problems: list | None = None, on_result: Callable | None = None,
                              sampled: bool = False, judge: JudgeReward | None = None) -> dict:
    """Evaluate checkpoint ``which`` ("latest", "best" by validation accuracy, or an RL
    step) of the run in ``workdir`` on ``split`` (greedy, the run's held-out problems) or
    on ``problems`` (e.g. tasks of one size). ``job`` may differ from the run's in its RL
    settings: e.g. another context strategy (``rl.rollout.context``). Returns what
    :func:`agent_summary_table` prints (``final``: that checkpoint), with ``step`` and
    ``episodes`` (each figure per problem, in order); ``initial`` is the run's own
    evaluation of its start on the test split. ``on_result(res, problems, first)``: each
    rollout call's result (:func:`~swarmjax.train.agent_eval.evaluate`), e.g. to collect a
    judge's training verdicts (:func:`~swarmjax.train.judge_sft.episode_triples`).
    ``sampled``: episodes sampled at the training rollout's temperatures instead of greedy
    (deterministic for the job's seed), e.g. right and wrong answers of one policy.
    ``judge``: score the episodes with this judge reward instead of the job's (its
    ``hf_path`` set: the run's own frozen judge copy stays in its checkpoint)."""
    job.validate()
    check_split(split)
    if sampled and job.engine != "host":
        raise ValueError("sampled evaluations run on the host engine: set engine='host'")
    run = AgentRun(job, workdir, fresh=False, progress=False)
    task = run.task
    try:
        step, state, meta = open_checkpoint(workdir, which, shapes=run.state_shapes(), learner=run.learner,
                                            identity=run.identity, checked=AgentRun.checked, base=run.lora_base())
        if sampled:                  # the training rollout's temperatures (its greedy twin left out)
            run.engine.close()
            run.engine = HostEngine(text_rollout(job, run.cfg, run.chat, greedy=False),
                                    lambda p: make_env(task, p, run.ctx))
        run.engine = judged(job.judge if judge is None else judge, task, run.engine, run.cfg, state, run.chat,
                            run.mesh)
        t0 = time.perf_counter()
        given = problems
        problems = run.splits[split] if given is None else list(given)
        episodes = evaluate(run.engine, rollout_params(state), problems, jax.random.fold_in(run.key, 1),
                            mesh=run.mesh, on_result=on_result)
    finally:
        run.close()
    sizes = per_size(task, problems, episodes)
    out = {"step": step, **labelled_figures("final", {**mean_figures(episodes), "sizes": sizes}),
           "episodes": {k: v.tolist() for k, v in episodes.items()},
           "held_out": {split if given is None else "given": len(problems)}, "rl_steps": step,
           "wall_clock_s": time.perf_counter() - t0, "backend": jax.default_backend()}
    if given is None:
        out.update(start_figures(meta, split, len(problems)))
    return out
