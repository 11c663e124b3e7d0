"""The stages of every text job, for any task plug-in (:mod:`swarmjax.envs.task`): their
configs and the warm start on played demonstrations (here), the reward and the RL step
(:mod:`swarmjax.train.agent_rl`), the greedy evaluation (:mod:`swarmjax.train.agent_eval`),
on either rollout engine (:mod:`swarmjax.train.engines`: the host-driven
``TextRollout`` that runs any task's Python tools, or the jitted ``TextSwarm``). The
job that runs them with checkpoints and resume: :mod:`swarmjax.train.agent_job` (any
task, on the host engine or, for a task with a device twin, the device engine).

Roles: a single agent, or an orchestrator whose sub-agents are **frozen** (a copy of
the params taken when RL starts, carried in ``TrainState.frozen["subagents"]`` and never
updated) or **shared** (the params being trained: their sampled ids join the loss as
rows of their own, with per-role advantages).

Reward of an episode (:func:`swarmjax.train.agent_rl.episode_rewards`), with ``r_perf`` the verifier's term
(0 for an episode that never answered: ended by its context or budget)::

    r = r_perf - turn_cost * orchestrator turns (+ DAPO's overlong penalty)
    orchestrator with ``parl``: r_perf is replaced by the PARL reward
        (swarmjax.rl.parl.parl_reward: r_parallel, r_finish, step and critical costs)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from swarmjax.envs.api import Played, play
from swarmjax.envs.task import ROLES, Demo, EnvContext, demonstration, make_env
from swarmjax.models.config import ModelConfig
from swarmjax.models.remat import remat_policy
from swarmjax.optim import OptimConfig
from swarmjax.rl.losses import loss_preset
from swarmjax.rl.parl import PARLConfig
from swarmjax.rl.trajectory import shared_head
from swarmjax.rl.update import UpdateConfig, check_group_batch
from swarmjax.roles import Roles
from swarmjax.swarm.text_rollout import TextRolloutConfig
from swarmjax.swarm.text_types import SwarmConfig
from swarmjax.train.async_rl import AsyncConfig
from swarmjax.train.demos import Demos, pack_rows, share_weights
from swarmjax.train.subagents import SubagentRefresh
from swarmjax.train.sft import RoleRows, sft_step, warm_start_loop

SUBAGENTS = ("frozen", "shared")
OVERLONG = ("error", "skip")           # what the warm start does with a demonstration longer than its context
SEGMENT_WEIGHTS = ("segment", "episode")
# whose conversation a warm-start row is: the top agent's in a role (with the summarize
# tool: "+summary") or a sub-agent's
ROW_KINDS = ("single", "single+summary", "orchestrator", "orchestrator+summary", "subagent")


@dataclasses.dataclass(frozen=True)
class TextSFTConfig:
    """The warm start: ``steps`` batches of ``batch`` rows from ``demos`` played
    episodes (every agent's conversation a row), cut to a multiple of ``bucket``.

    mix: more ways of working whose demonstrations of the same problems join the job's
      own (:func:`demonstrations`), each ``"single"`` or ``"orchestrator"``, with
      ``"+summary"`` for the ``summarize`` tool (e.g. ``("single+summary",
      "orchestrator")``): one policy for several roles and context strategies.
    per_role: the orchestrator's rows and its sub-agents' as two roles of the one step
      (:func:`warm_start`): every step ``batch`` rows of each, so an orchestrator whose
      sub-agents hold many short conversations sees its own as often as theirs (False:
      every conversation a row of one role).
    overlong: a demonstration with a conversation longer than its context: ``"error"``,
      or ``"skip"`` (left out; the agent job prints the count and keeps it in its summary,
      ``warm_start_data``).
    shares: (kind, share) pairs: the expected share of each kind of row in a batch (kinds
      :data:`ROW_KINDS`: the top agent's conversations in a way of working, ``"single"``,
      ``"single+summary"``, ``"orchestrator"``, ...; ``"subagent"``: its sub-agents'), e.g.
      ``(("single", 0.15), ("single+summary", 0.3), ("orchestrator", 0.3), ("subagent",
      0.25))`` so that an orchestrator's one conversation per demonstration is not
      outnumbered by its sub-agents' and the serial ways' (empty: every row alike). Not
      with ``per_role``.
    by_length: each batch's rows from one length bucket (a multiple of ``bucket``), the
      bucket and its rows drawn so that every row is as likely as in a mixed batch
      (:func:`~swarmjax.train.sft.sample_bucketed`): rows of mixed lengths (sub-agents'
      short conversations beside an orchestrator's long one) are not all padded to the
      longest, for fewer ids a step (one compiled step per bucket length). The loss is
      still each batch's mean over its ids, so a short batch's ids weigh more than in a
      mixed one.
    remat: the layers' rematerialisation in the step's backward pass
      (:func:`~swarmjax.models.remat.remat_policy`), as ``rl.update.remat`` is the
      learner's: "dots" (the default) keeps the weight matmuls' outputs and recomputes the
      rest, so Qwen3-0.6B's 16 x 512 step plans at 20 GiB, not 54 ("none"); "block" keeps
      only each layer's input (13 GiB). The logits are chunked by default
      (:func:`~swarmjax.train.sft.sft_step`).
    """

    steps: int = 600
    batch: int = 32
    demos: int = 4096
    bucket: int = 64
    optim: OptimConfig = OptimConfig(learning_rate=3e-3, warmup_steps=20, decay_steps=600)
    mix: tuple[str, ...] = ()
    overlong: str = "error"
    per_role: bool = False
    shares: tuple[tuple[str, float], ...] = ()
    by_length: bool = False
    remat: str = "dots"

    def __post_init__(self):
        remat_policy(self.remat)              # a clear error for an unknown name, at config time
        if min(self.steps, self.batch, self.demos, self.bucket) < 1:
            raise ValueError("sft steps, batch, demos and bucket must be >= 1")
        kinds = [k for k, _ in self.shares]
        if self.shares and (self.per_role or len(set(kinds)) < len(kinds)
                            or not set(kinds) <= set(ROW_KINDS) or min(v for _, v in self.shares) <= 0):
            raise ValueError(f"sft.shares: distinct kinds of {', '.join(ROW_KINDS)} with shares > 0, "
                             f"not with sft.per_role; got {self.shares!r}")
        if self.overlong not in OVERLONG:
            raise ValueError(f"unknown sft.overlong {self.overlong!r}; known: {', '.join(OVERLONG)}")
        for way in self.mix:
            mix_context(way, None)


def mix_context(way: str, ctx: EnvContext | None) -> EnvContext | None:
    """The :class:`EnvContext` of a ``TextSFTConfig.mix`` entry (``"<role>[+summary]"``)
    over ``ctx``'s chat and runner (None: only check the entry)."""
    role, _, extra = way.partition("+")
    if role not in ROLES or extra not in ("", "summary"):
        raise ValueError(f"unknown sft.mix entry {way!r}: '<role>' or '<role>+summary' with role in {', '.join(ROLES)}")
    return None if ctx is None else dataclasses.replace(ctx, role=role, summarize=extra == "summary")


@dataclasses.dataclass(frozen=True)
class OverlongConfig:
    """DAPO's soft overlong punishment (Yu et al. 2025, arXiv 2503.14476, section 3.4).

    With ``L`` the tokens the policy sampled in an episode (all its orchestrator turns:
    the ones the loss trains on), ``L_max = max_length`` and ``L_cache = cache_length``::

        0                                  if L <= L_max - L_cache
        ((L_max - L_cache) - L) / L_cache  if L_max - L_cache < L <= L_max   (0 -> -1)
        -1                                 if L > L_max
    """

    max_length: int = 256
    cache_length: int = 64

    def __post_init__(self):
        if not 0 < self.cache_length <= self.max_length:
            raise ValueError(f"overlong: need 0 < cache_length ({self.cache_length}) <= "
                             f"max_length ({self.max_length})")


@dataclasses.dataclass(frozen=True)
class TextRLConfig:
    """The RL stage.

    steps, tasks_per_step, group_size: RL steps; problems per step; rollouts per problem
      (one advantage group).
    advantage: estimator, a key of :data:`swarmjax.rl.advantages.ADVANTAGES`.
    dynamic_sampling: groups whose rewards are all equal get no loss tokens (DAPO).
    turn_cost: reward -= turn_cost * orchestrator turns.
    overlong: DAPO's soft overlong penalty on each episode's sampled-token count (None: off).
    parl: the PARL reward for orchestrators (None: ``r_perf`` alone); its
      ``r_parallel`` form must be one whose counts the task's verifier reports
      (``"spawned"`` needs none).
    update, rollout: the learner's and the rollout's settings.
    swarm: the device engine's own settings (:class:`~swarmjax.swarm.text_types.SwarmConfig`;
      the host engine has none).
    bucket: learner rows are cut to ``bucket * 2**k`` ids, the least that holds the step's
      longest row (:func:`~swarmjax.train.agent_rl.row_width`): one compiled update per
      width, so a job compiles at most ``log2(context / bucket) + 1`` of them.
    head_multiple: the ids every learner row opens with (system turn, tool schemas) run
      once per forward (``Learner.update(head=)``), cut to a multiple of this; 0: off.
    segment_weight: how the rows of an episode a context strategy split into K + 1
      segments count in the loss (:func:`segment_weights`): ``"segment"`` (each a row of
      weight 1, as ReSum-GRPO trains them) or ``"episode"`` (each 1 / (K + 1): under a
      per-sequence aggregation the episode counts as much as one that never compacted).
    async_rollout: rollouts overlapped with updates (:mod:`swarmjax.train.async_rl`;
      depth 0: roll out, then update).
    refresh_subagents: when frozen sub-agents become a copy of the policy
      (:mod:`swarmjax.train.subagents`; default never).
    """

    steps: int = 60
    tasks_per_step: int = 8
    group_size: int = 8
    advantage: str = "grpo"
    dynamic_sampling: bool = True
    turn_cost: float = 0.0
    overlong: OverlongConfig | None = None
    parl: PARLConfig | None = None
    update: UpdateConfig = UpdateConfig(loss=loss_preset("gspo"), num_minibatches=4,
                                        optim=OptimConfig(learning_rate=3e-4))
    rollout: TextRolloutConfig = TextRolloutConfig(contexts=Roles(512, 256), max_turn_tokens=48,
                                                   subagent_lanes=8, subagent_turns=3)
    swarm: SwarmConfig = SwarmConfig()
    bucket: int = 64
    head_multiple: int = 0
    segment_weight: str = "segment"
    async_rollout: AsyncConfig = AsyncConfig()
    refresh_subagents: SubagentRefresh = SubagentRefresh()

    def __post_init__(self):
        if self.segment_weight not in SEGMENT_WEIGHTS:
            raise ValueError(f"unknown segment_weight {self.segment_weight!r}; known: {', '.join(SEGMENT_WEIGHTS)}")
        if self.bucket < 1 or self.head_multiple < 0:
            raise ValueError(f"bucket must be >= 1 and head_multiple >= 0, got {self.bucket}, {self.head_multiple}")
        if min(self.steps, self.tasks_per_step, self.group_size) < 0:
            raise ValueError("rl steps, tasks_per_step and group_size must be >= 0")
        check_group_batch(self.advantage, self.tasks_per_step, self.group_size, self.update)
        if self.async_rollout.rollout_devices > 1:
            raise ValueError("a text rollout decodes on one device: async_rollout.rollout_devices must be 0 or 1")

    def bound(self, task: Any) -> "TextRLConfig":
        """This config for ``task`` (a text task's rules live in the task: itself)."""
        return self


# ------------------------------------------------------------------------ warm start


def demonstrations(task: Any, problems: list, ctx: EnvContext, rng: np.random.Generator,
                   limits: TextRolloutConfig | None = None, *, mix: Sequence[EnvContext] = (),
                   overlong: str = "error", scripts: Sequence[tuple[Any, Demo]] | None = None,
                   per_role: bool = False, shares: Sequence[tuple[str, float]] = ()
                   ) -> Demos | tuple[Demos, Demos] | None:
    """Every agent's conversation of the task's demonstrations of ``problems`` in
    ``ctx.role`` (with the ``summarize`` tool when ``ctx.summarize``: each segment of a
    conversation a summary restarted is a row of its own), played through fresh
    environments (:func:`swarmjax.envs.api.play`: the ids a rollout that sampled those
    turns builds), as rows [N, T] right-padded with the pad id; None when the task has no
    demonstrations for the role. ``mix``: more contexts (another role, the ``summarize``
    tool) whose demonstrations of the same problems join the rows: one policy warm-started
    for several ways of working. ``scripts``: (problem, :class:`Demo`) pairs that replace
    ``ctx``'s demonstrations (a task's ``demonstration_set``; ``problems`` are then the
    mix's). ``per_role``: (the top agents' rows [N, T], their sub-agents' rows [M, W]),
    each padded to its own longest, the sub-agents' in spawn order. Each row's kind is
    recorded (``Demos.kinds``); ``shares``: the batch share of each kind
    (:func:`~swarmjax.train.demos.share_weights`, ``TextSFTConfig.shares``).

    With ``limits`` (the RL rollout's config) a turn longer than ``max_turn_tokens`` is an
    error (the rollout could never produce it), and so is a conversation longer than its
    role's context, unless ``overlong="skip"``: then that demonstration is left out and
    counted (``Demos.skipped``)."""
    if overlong not in OVERLONG:
        raise ValueError(f"unknown overlong {overlong!r}; known: {', '.join(OVERLONG)}")
    rows, skipped = [], 0
    played = [(ctx, p, demonstration(task, p, ctx.chat, rng, ctx.role, summarize=ctx.summarize))
              for p in problems] if scripts is None else [(ctx, p, demo) for p, demo in scripts]
    for c in mix:
        played += [(c, p, demonstration(task, p, c.chat, rng, c.role, summarize=c.summarize)) for p in problems]
    for c, p, demo in played:
        if demo is None:
            continue
        if limits is not None:
            longest = max(len(t) for t in [*demo.turns, *(t for w in demo.workers for t in w)])
            if longest > limits.max_turn_tokens:
                raise ValueError(f"a demonstration turn holds {longest} ids, more than rl.rollout."
                                 f"max_turn_tokens={limits.max_turn_tokens}: the rollout would cut it; raise it")
        mine, over = _played_rows(play(make_env(task, p, c), p, demo.turns, workers=demo.workers), limits,
                                  role=c.role)
        if over is not None and overlong == "error":
            raise ValueError(f"a demonstration's {over}: raise it, or summarise sooner, or set sft.overlong="
                             "'skip' (nothing is cut)")
        skipped += over is not None
        if over is None:
            way = c.role + ("+summary" if c.summarize else "")
            rows.append([(ids, mask, first, way if first else "subagent") for ids, mask, first in mine])
    if not rows:
        return None
    pad = int(ctx.chat.ids[ctx.chat.pad_token][0])

    def pack(rs, skipped=0):
        return pack_rows([r[:2] for r in rs], max(len(r[0]) for r in rs), pad=pad, skipped=skipped,
                         kinds=[r[2] for r in rs])
    if not per_role:
        data = pack([(ids, mask, kind) for mine in rows for ids, mask, _, kind in mine], skipped)
        return dataclasses.replace(data, weights=share_weights(data.kinds, dict(shares))) if shares else data
    top = [(ids, mask, kind) for mine in rows for ids, mask, first, kind in mine if first]
    subs = [(ids, mask, kind) for mine in rows for ids, mask, first, kind in mine[::-1] if not first]
    if not subs:
        raise ValueError("sft.per_role: no demonstration starts a sub-agent (the second role has no rows); raise "
                         "the task's share of delegating demonstrations, or set sft.per_role=False")
    return pack(top, skipped), pack(subs)


def _played_rows(played: Played, limits: TextRolloutConfig | None, *, role: str = "orchestrator"
                 ) -> tuple[list, str | None]:
    """The (ids, own-ids mask, top agent?) rows of a played demonstration (every agent,
    every segment; the top agent's first, then its sub-agents' from the last started) and,
    when one exceeds its role's context in ``limits``, what (else None; the top agent named
    by its ``role``: "single" or "orchestrator")."""
    rows, over, stack = [], None, [(played, True)]
    while stack:
        agent, orch = stack.pop()
        context = None if limits is None else limits.contexts.orchestrator if orch else limits.contexts.subagents
        for ids, mask in [*agent.segments, (agent.ids, agent.mask)]:         # each segment a row of its own
            if context is not None and len(ids) > context and over is None:
                who = ("single agent's" if role == "single" else "orchestrator") if orch else "sub-agent"
                over = (f"{who} conversation holds {len(ids)} ids, more than "
                        f"its context ({context}, rl.rollout.{'orch' if orch else 'worker'}_context)")
            rows.append((ids, mask, orch))
        stack.extend((sub, False) for sub in agent.subagents)
    return rows, over


def warm_start(params: Any, cfg: ModelConfig, data: Demos | tuple[Demos, Demos], scfg: TextSFTConfig, seed: int,
               on_step: Callable[[int, dict], None] | None = None, *, mesh: Any = None, saves: Any = None) -> Any:
    """Masked next-token training on ``data`` (the agents' own ids) with the one
    warm-start step (:func:`swarmjax.train.sft.sft_step`; QK-Clip after every step with
    ``optim.qk_clip_tau > 0``), batches drawn with ``np.random.default_rng(seed)``:

    - one role ``"agent"`` (``data`` one :class:`Demos`): ``batch`` rows drawn uniformly,
      cut to the longest row's length bucket (a multiple of ``bucket``); metrics ``loss``,
      ``agent_acc``;
    - ``scfg.per_role`` (``data``: the orchestrators' rows and the sub-agents'): each step
      ``batch`` orchestrator rows of one length bucket and ``batch`` sub-agent rows (cut
      to their longest), loss = orchestrator NLL + sub-agent NLL (per-role means over the
      agent's own ids); the ids every row of a role opens with (system turn, tool
      schemas) run once per step (:func:`~swarmjax.train.sft.prefix_role_stats`: the same
      loss and gradients); metrics ``orch_nll``/``orch_acc``/``worker_nll``/``worker_acc``.

    ``mesh``: params and optimizer state sharded as the learner shards them, batch rows
    over the data axes (every process passes the same ``params`` and ``data``, and they
    step together). ``saves``: the job's warm-start checkpoints, continued from and saved
    to (:func:`~swarmjax.train.sft.warm_start_loop`). Returns the params (sharded over
    ``mesh`` when given)."""
    rng = np.random.default_rng(seed)
    if not scfg.per_role:
        params, opt_state, step = sft_step(params, cfg, scfg.optim, roles=("agent",), mesh=mesh, remat=scfg.remat)
        rows = RoleRows(data, scfg.batch, scfg.bucket, bucketed=scfg.by_length)
        return warm_start_loop(params, step, opt_state, (rows,), scfg.steps, rng, on_step, mesh=mesh, saves=saves)
    orch, work = data
    heads = tuple(jnp.asarray(d.tokens[0, :shared_head(d.tokens, d.token_mask, d.loss_mask)]) for d in (orch, work))
    params, opt_state, step = sft_step(params, cfg, scfg.optim, heads=heads, mesh=mesh, remat=scfg.remat)
    W = int(work.token_mask.sum(1).max())              # sub-agent rows: cut to the longest
    roles = (RoleRows(orch, scfg.batch, scfg.bucket, bucketed=True, head=len(heads[0])),
             RoleRows(work, scfg.batch, W, head=len(heads[1])))
    return warm_start_loop(params, step, opt_state, roles, scfg.steps, rng, on_step, mesh=mesh, saves=saves)
