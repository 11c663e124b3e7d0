"""Stage 2 — PARL: the orchestrator learns to delegate, with frozen sub-agents.

One training step (every job's RL step, :func:`swarmjax.train.agent_rl.rl_step`, on
the token engine :class:`~swarmjax.train.engines.TokenEngine`):

1. ``tasks_per_step`` tasks, each repeated ``group_size`` times (G samples per task);
2. one jitted swarm rollout (:class:`~swarmjax.swarm.engine.SwarmRollout`): orchestrator
   with the trained params, sub-agents with the frozen warm-start params; its result as
   the one result type (:func:`~swarmjax.swarm.outcome.text_result`);
3. PARL reward ``r_perf + lambda1(t) r_parallel + lambda2(t) r_finish - c * total_steps
   - c_crit * critical_steps`` (:func:`~swarmjax.rl.parl.parl_reward`) with ``lambda1``,
   ``lambda2`` annealed by the training step;
4. group-relative advantages (GRPO / Dr. GRPO / batch std), optionally dynamic
   sampling (groups whose rewards are all equal get no loss tokens);
5. one :class:`~swarmjax.rl.update.Learner` update (GSPO by default, several
   minibatches, Muon + QK-Clip) on exactly the rollout's token ids, loss mask and
   sampler log-probs.

Evaluations run the greedy rollout with the budget lifted (each policy's natural cost)
through every job's evaluation (:func:`swarmjax.train.agent_eval.evaluate`), per task size.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from swarmjax.envs import widesearch_jax as wsj
from swarmjax.models.config import ModelConfig
from swarmjax.rl.losses import loss_preset
from swarmjax.rl.parl import PARLConfig
from swarmjax.rl.update import Learner, TrainState, UpdateConfig, check_group_batch
from swarmjax.roles import Roles
from swarmjax.sampling.processors import SamplingConfig
from swarmjax.models.transformer import param_logical_axes
from swarmjax.sharding.mesh import tree_shardings
from swarmjax.swarm.engine import RolloutConfig, SwarmRollout
from swarmjax.train.async_rl import AsyncConfig, logged_update
from swarmjax.train.subagents import SubagentRefresh

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class PARLTrainConfig:
    """The token engine's RL stage (a job's ``rl`` with ``engine="token"``): ``steps`` PARL
    steps of ``tasks_per_step`` tasks x ``group_size`` rollouts. ``rollout.env`` None:
    the task's rules (:meth:`bound`)."""

    steps: int = 200
    rollout: RolloutConfig = RolloutConfig()
    parl: PARLConfig = PARLConfig()
    update: UpdateConfig = UpdateConfig(loss=loss_preset("gspo"), num_minibatches=4)
    tasks_per_step: int = 8
    group_size: int = 8                # G rollouts per task
    advantage: str = "grpo"            # key of rl.advantages.ADVANTAGES
    dynamic_sampling: bool = False     # drop (mask) groups whose rewards are all equal
    async_rollout: AsyncConfig = AsyncConfig()     # depth 0: roll out, then update (synchronous)
    refresh_subagents: SubagentRefresh = SubagentRefresh()   # default: the warm start stays the sub-agents

    def __post_init__(self):
        if self.tasks_per_step < 1 or self.group_size < 1 or self.steps < 0:
            raise ValueError("tasks_per_step and group_size must be >= 1, steps >= 0")
        check_group_batch(self.advantage, self.tasks_per_step, self.group_size, self.update)

    @property
    def batch(self) -> int:
        return self.tasks_per_step * self.group_size

    def bound(self, task: Any) -> "PARLTrainConfig":
        """This config over ``task``'s rules (``task.cfg``, a
        :class:`~swarmjax.envs.widesearch_token_task.WideSearchTokens`)."""
        return dataclasses.replace(self, rollout=dataclasses.replace(self.rollout, env=task.cfg))

    # what the one RL step (swarmjax.train.agent_rl.collect) reads beside the fields above:
    # no turn cost, no overlong penalty (contexts bound every episode), no context
    # strategy, learner rows as wide as the orchestrator's context (one compile)
    turn_cost, overlong, segment_weight, head_multiple = 0.0, None, "segment", 0

    @property
    def bucket(self) -> int:
        return self.rollout.env.contexts.orchestrator


class PARLTrainer:
    """The token world's RL pieces, one call per training step: the learner, the token
    engine (:class:`~swarmjax.train.engines.TokenEngine`: the jitted swarm's sampling
    rollout and, budget lifted, its greedy one) and the state with the frozen sub-agents.
    A step is every job's RL step (:func:`swarmjax.train.agent_rl.rl_step`).

    >>> trainer = PARLTrainer(model_cfg, PARLTrainConfig())
    >>> state = trainer.init(Roles.both(warm_params))
    >>> state, metrics = trainer.step(state, jax.random.key(i), step=i)
    """

    def __init__(self, model_cfg: ModelConfig | Roles[ModelConfig], cfg: PARLTrainConfig, *,
                 mesh: Mesh | None = None, rollout_mesh: Mesh | None = None, eval_batch: int | None = None):
        """``model_cfg``: both roles' model config, or a ``Roles`` of the two.
        ``rollout_mesh``: the rollout's own devices (asynchronous jobs,
        :mod:`swarmjax.train.async_rl`); default: the learner's ``mesh`` (the greedy
        rollout's). ``eval_batch``: the evaluations' call size (None: all at once)."""
        cfgs = Roles.of(model_cfg)
        self.model_cfg, self.cfg, self.mesh = cfgs.orchestrator, cfg, mesh
        self.engine = token_engine_over(cfgs, cfg.rollout, mesh=mesh, rollout_mesh=rollout_mesh,
                                        eval_batch=eval_batch)
        self.learner = Learner(cfgs.orchestrator, logged_update(cfg.update, cfg.async_rollout), mesh=mesh)

    def init(self, params: Roles) -> TrainState:
        """Train state over copies of ``params.orchestrator``; the frozen sub-agents
        (``params.subagents``) ride along in ``state.frozen["subagents"]`` (copied too: the
        learner donates its state). With a
        KL term (``update.loss.kl_beta > 0``) the reference policy is the starting
        orchestrator, ``state.frozen["reference"]``."""
        copy = lambda tree: jax.tree.map(jnp.copy, tree)
        frozen = {"subagents": copy(params.subagents)}
        if self.cfg.update.loss.kl_beta > 0:
            frozen["reference"] = copy(params.orchestrator)
        return self.learner.init(copy(params.orchestrator), frozen=frozen)

    def step(self, state: TrainState, key: Array, step: int, *, tasks: list | None = None
             ) -> tuple[TrainState, dict[str, float]]:
        """One PARL step (the module docstring) on ``tasks`` (``tasks_per_step`` problems of
        :func:`~swarmjax.envs.widesearch_jax.problems`; sampled fresh from ``key`` when
        None), rolled out with ``split(key)[1]``. ``step``: the PARL step index, which
        drives the lambda schedules. Returns the state and every job's step metrics
        (:func:`~swarmjax.train.agent_rl.rl_step`: ``accuracy`` is the item-F1)."""
        from swarmjax.train.agent_rl import rl_step
        k_tasks, k_roll = jax.random.split(key)
        if tasks is None:
            tasks = wsj.problems(wsj.reset(k_tasks, self.cfg.rollout.env, self.cfg.tasks_per_step))
        if len(tasks) != self.cfg.tasks_per_step:
            raise ValueError(f"got {len(tasks)} tasks, tasks_per_step is {self.cfg.tasks_per_step}")
        return rl_step(self.learner, state, self.engine, tasks, k_roll, self.cfg, step=step)

    def publish(self, params: Any) -> Any:
        """A copy of ``params`` for the rollout (the learner's update donates its own): laid
        out over the rollout's mesh when it has devices of its own."""
        return (self.engine.publish or _copy)(params)


def _copy(params: Any) -> Any:
    return jax.tree.map(jnp.copy, params)


def token_engine_over(model_cfg: ModelConfig | Roles[ModelConfig], rcfg: RolloutConfig, *, mesh: Mesh | None = None,
                      rollout_mesh: Mesh | None = None, eval_batch: int | None = None):
    """The token engine (:class:`~swarmjax.train.engines.TokenEngine`) of ``model_cfg``
    (both roles', or a ``Roles``): ``rcfg``'s sampling
    rollout over ``rollout_mesh`` (default ``mesh``) and its greedy twin (the budget
    lifted) over ``mesh``, evaluations in calls of ``eval_batch`` episodes (None: all at
    once). With a rollout mesh of its own, its ``publish`` lays the learner's params out
    over it."""
    from swarmjax.train.engines import TokenEngine

    cfgs = Roles.of(model_cfg)
    rollout_mesh = mesh if rollout_mesh is None else rollout_mesh
    publish = None if rollout_mesh is mesh else (lambda params: jax.device_put(
        params, tree_shardings(param_logical_axes(cfgs.orchestrator), params, rollout_mesh)))
    return TokenEngine(SwarmRollout(rcfg, cfgs, mesh=rollout_mesh), SwarmRollout(greedy(rcfg), cfgs, mesh=mesh),
                       batch=eval_batch, publish=publish)


def greedy(rcfg: RolloutConfig, budget: int | None = None) -> RolloutConfig:
    """Evaluation rollouts: greedy decoding for both roles, the budget replaced."""
    return dataclasses.replace(rcfg, env=dataclasses.replace(rcfg.env, budget=budget),
                               sampling=Roles.both(SamplingConfig(temperature=0.0)))


def sample_eval_tasks(key: Array, env, sizes: list[int] | tuple[int, ...], episodes: int) -> list[dict]:
    """``episodes`` fresh tasks of each size n, size by size, as a problem list
    (:func:`~swarmjax.envs.widesearch_jax.problems`; for a job, use the held-out split
    instead: :func:`swarmjax.envs.widesearch_token_task.eval_tasks`)."""
    return [p for n in sizes for p in wsj.problems(wsj.reset(jax.random.fold_in(key, n), env, episodes, n=n))]
