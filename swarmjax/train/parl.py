"""Stage 2 — PARL: the orchestrator learns to delegate, with frozen sub-agents.

One training step:

1. ``tasks_per_step`` fresh tasks, each repeated ``group_size`` times (G samples per task);
2. one jitted swarm rollout (:class:`~swarmjax.swarm.engine.SwarmRollout`): orchestrator
   with the trained params, sub-agents with the frozen warm-start params;
3. PARL reward ``r_perf + lambda1(t) r_parallel + lambda2(t) r_finish - c * total_steps
   - c_crit * critical_steps`` (:func:`~swarmjax.rl.parl.parl_reward`) with ``lambda1``,
   ``lambda2`` annealed by the training step;
4. group-relative advantages (GRPO / Dr. GRPO / batch std), optionally dynamic
   sampling (groups whose rewards are all equal get no loss tokens);
5. one :class:`~swarmjax.rl.update.Learner` update (GSPO by default, several
   minibatches, Muon + QK-Clip) on exactly the rollout's token ids, loss mask and
   sampler log-probs.

:func:`evaluate` measures a policy per task size n with the budget lifted (each
policy's natural cost): item-F1, critical / total steps, sub-agents per episode and
the fraction of episodes that spawn none.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from swarmjax.envs import widesearch_jax as wsj
from swarmjax.models.config import ModelConfig
from swarmjax.rl.advantages import compute_advantages, uniform_groups
from swarmjax.rl.losses import loss_preset
from swarmjax.envs.scoring import item_f1
from swarmjax.rl.parl import PARLConfig
from swarmjax.rl.trajectory import TrajectoryBatch
from swarmjax.rl.update import Learner, TrainState, UpdateConfig, check_group_batch
from swarmjax.sampling.processors import SamplingConfig
from swarmjax.models.transformer import param_logical_axes
from swarmjax.sharding.mesh import batch_sharding, tree_shardings
from swarmjax.swarm.engine import RolloutConfig, RolloutResult, SwarmRollout
from swarmjax.swarm.outcome import episode_rewards, novel_subagents
from swarmjax.train.async_rl import AsyncConfig, logged_update
from swarmjax.train.subagents import SubagentRefresh

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class PARLTrainConfig:
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
        if self.tasks_per_step < 1 or self.group_size < 1:
            raise ValueError("tasks_per_step and group_size must be >= 1")
        check_group_batch(self.advantage, self.tasks_per_step, self.group_size, self.update)

    @property
    def batch(self) -> int:
        return self.tasks_per_step * self.group_size


# PARL step metrics besides the reward channels' means (all reduced on the device)
BATCH_METRICS = ("reward", "item_f1", "critical_steps", "total_steps", "subagents", "finished_subagents",
                 "novel_subagents", "answered", "kept_groups", "signal_groups", "cut_by_max_ticks", "orch_tokens",
                 "sampled_tokens")


def trajectories(result: RolloutResult, advantages: Array, group_ids: Array, rewards: Array) -> TrajectoryBatch:
    """The orchestrator rows of a rollout as a learner batch (token-in-token-out: the
    exact ids, loss only on the orchestrator's sampled tokens, the sampler's log-probs)."""
    C = result.tokens.shape[1]
    token_mask = jnp.arange(C)[None, :] < result.length[:, None]
    return TrajectoryBatch.create(result.tokens, result.loss_mask, advantages, token_mask=token_mask,
                                  sampler_logprobs=result.logprobs, group_ids=group_ids, rewards=rewards)


class PARLTrainer:
    """Rollout + reward + update, one call per training step.

    >>> trainer = PARLTrainer(model_cfg, PARLTrainConfig())
    >>> state = trainer.init(warm_params, worker_params=warm_params)
    >>> state, metrics = trainer.step(state, jax.random.key(i), step=i)
    """

    def __init__(self, model_cfg: ModelConfig, cfg: PARLTrainConfig, *, worker_cfg: ModelConfig | None = None,
                 mesh: Mesh | None = None, rollout_mesh: Mesh | None = None):
        """``rollout_mesh``: the rollout's own devices (asynchronous jobs,
        :mod:`swarmjax.train.async_rl`); default: the learner's ``mesh``."""
        self.model_cfg, self.cfg, self.mesh = model_cfg, cfg, mesh
        self.rollout_mesh = mesh if rollout_mesh is None else rollout_mesh
        self.engine = SwarmRollout(cfg.rollout, model_cfg, worker_cfg=worker_cfg, mesh=self.rollout_mesh)
        self.learner = Learner(model_cfg, logged_update(cfg.update, cfg.async_rollout), mesh=mesh)
        self._rewards = jax.jit(self._rewards_impl)

    def init(self, params: Any, worker_params: Any) -> TrainState:
        """Train state over copies of ``params``; the frozen sub-agents ride along in
        ``state.frozen["subagents"]`` (copied too: the learner donates its state). With a
        KL term (``update.loss.kl_beta > 0``) the reference policy is the starting
        orchestrator, ``state.frozen["reference"]``."""
        copy = lambda tree: jax.tree.map(jnp.copy, tree)
        frozen = {"subagents": copy(worker_params)}
        if self.cfg.update.loss.kl_beta > 0:
            frozen["reference"] = copy(params)
        return self.learner.init(copy(params), frozen=frozen)

    def _rewards_impl(self, result: RolloutResult, group_ids: Array, step: Array
                      ) -> tuple[TrajectoryBatch, dict[str, Array]]:
        """The learner batch and the step's batch metrics: a dict of scalars (every reward
        channel's mean and :data:`BATCH_METRICS`), reduced here on the device: per-episode
        arrays may span several processes' devices, their means are replicated."""
        reward, channels = episode_rewards(result, self.cfg.parl, step)
        adv = compute_advantages(self.cfg.advantage, reward, group_ids)
        signal = ~uniform_groups(reward, group_ids)                      # rewards differ in the group
        keep = signal if self.cfg.dynamic_sampling else jnp.ones_like(reward, bool)
        batch = trajectories(result, adv, group_ids, reward)
        batch = batch.replace(loss_mask=batch.loss_mask & keep[:, None])
        if self.rollout_mesh is not None:   # laid out as the learner takes it (no resharding across processes)
            batch = jax.tree.map(lambda x: jax.lax.with_sharding_constraint(
                x, batch_sharding(self.rollout_mesh, x.ndim, batch_size=x.shape[0])), batch)
        metrics = {k: jnp.mean(v) for k, v in channels.items()}
        metrics.update(
            reward=jnp.mean(reward), item_f1=metrics["r_perf"],
            critical_steps=jnp.mean(result.critical_steps), total_steps=jnp.mean(result.total_steps),
            subagents=jnp.mean(result.spawned), finished_subagents=jnp.mean(result.finished),
            novel_subagents=jnp.mean(novel_subagents(result)),
            answered=jnp.mean(result.end_reason == wsj.END_ANSWER), kept_groups=jnp.mean(keep),
            signal_groups=jnp.mean(signal),
            cut_by_max_ticks=result.cut_by_max_ticks,     # episodes the loop bound cut: 0
            orch_tokens=jnp.sum(result.length),
            sampled_tokens=jnp.sum(result.loss_mask) + jnp.sum(result.worker_sampled))
        return batch, metrics

    def step(self, state: TrainState, key: Array, step: int, *, tasks: wsj.Tasks | None = None
             ) -> tuple[TrainState, dict[str, float]]:
        """One PARL step (see the module docstring). ``step``: the PARL step index (rollout
        batches so far), which drives the lambda schedules; ``tasks``: ``tasks_per_step``
        tasks (e.g. from :func:`swarmjax.data.task_iterator`), sampled fresh from ``key``
        when None. Metrics: reward and every channel (batch means), item-F1, critical /
        total steps, sub-agents, answered fraction, episodes cut by the rollout's
        ``max_ticks`` (0: a bound), the learner's metrics, timings."""
        cfg = self.cfg
        k_tasks, k_roll = jax.random.split(key)
        if tasks is None:
            tasks = wsj.reset(k_tasks, cfg.rollout.env, cfg.tasks_per_step)
        collected = self.collect(state.params, state.frozen["subagents"], tasks, k_roll, step)
        return self.learn(state, collected)

    def collect(self, params: Any, worker_params: Any, tasks: wsj.Tasks, key: Array, step: int) -> "Collected":
        """The rollout half of :meth:`step`: ``tasks`` (``tasks_per_step`` of them) rolled
        out ``group_size`` times each with ``params`` (and the sub-agents'
        ``worker_params``), rewarded as PARL step ``step``; returns once the learner batch
        is ready."""
        cfg = self.cfg
        t0 = time.perf_counter()
        if tasks.n.shape[0] != cfg.tasks_per_step:
            raise ValueError(f"got {tasks.n.shape[0]} tasks, tasks_per_step is {cfg.tasks_per_step}")
        tasks, groups = wsj.repeat_groups(tasks, cfg.group_size)
        result = self.engine(params, worker_params, tasks, key)
        batch, batch_metrics = self._rewards(result, groups, jnp.asarray(step, jnp.int32))
        jax.block_until_ready(batch)
        return Collected(batch, batch_metrics, time.perf_counter() - t0)

    def publish(self, params: Any) -> Any:
        """A copy of ``params`` for the rollout (the learner's update donates its own): laid
        out over the rollout's mesh when it has devices of its own."""
        if self.rollout_mesh is self.mesh:
            return jax.tree.map(jnp.copy, params)
        return jax.device_put(params, tree_shardings(param_logical_axes(self.model_cfg), params, self.rollout_mesh))

    def learn(self, state: TrainState, collected: "Collected") -> tuple[TrainState, dict[str, float]]:
        """The update half of :meth:`step`: one learner update on a collected batch (placed
        on the learner's devices first when the rollout has its own); the step's metrics."""
        batch = collected.batch
        if self.rollout_mesh is not self.mesh:
            batch = jax.device_put(batch, jax.tree.map(
                lambda x: batch_sharding(self.mesh, x.ndim, batch_size=x.shape[0]) if self.mesh is not None
                else jax.sharding.SingleDeviceSharding(jax.local_devices()[0]), batch))
        t1 = time.perf_counter()
        state, learn = self.learner.update(state, batch)
        # one transfer: the learner's metrics and the batch metrics (replicated scalars)
        learn, batch_metrics = jax.device_get((learn, collected.metrics))
        t2 = time.perf_counter()
        batch_metrics = {k: float(v) for k, v in batch_metrics.items()}
        # the reward channels first (sorted, as they come back), then the rest in a fixed order
        metrics = {k: v for k, v in batch_metrics.items() if k not in BATCH_METRICS}
        metrics.update({k: batch_metrics[k] for k in BATCH_METRICS[:-2]})
        metrics.update(rollout_s=collected.seconds, update_s=t2 - t1)
        metrics.update({k: batch_metrics[k] for k in BATCH_METRICS[-2:]})
        metrics.update({f"learner/{k}": float(np.mean(v)) for k, v in learn.items()})
        return state, metrics


class Collected(NamedTuple):
    """A rolled-out, rewarded batch waiting for the learner."""

    batch: TrajectoryBatch         # [B, ...] laid out over the rollout's devices
    metrics: dict[str, Array]      # the batch metrics, replicated scalars
    seconds: float                 # the rollout's wall time until the batch was ready


def greedy(rcfg: RolloutConfig, budget: int | None = None) -> RolloutConfig:
    """Evaluation rollouts: greedy decoding for both roles, the budget replaced."""
    g = SamplingConfig(temperature=0.0)
    return dataclasses.replace(rcfg, env=dataclasses.replace(rcfg.env, budget=budget),
                               orch_sampling=g, worker_sampling=g)


def sample_eval_tasks(key: Array, env, sizes: list[int] | tuple[int, ...], episodes: int) -> dict[int, wsj.Tasks]:
    """``episodes`` fresh tasks of each size n (for a job, use the held-out split instead:
    :func:`swarmjax.train.job.eval_tasks`)."""
    return {n: wsj.reset(jax.random.fold_in(key, n), env, episodes, n=n) for n in sizes}


def evaluate(engine: SwarmRollout, params: Any, worker_params: Any, tasks: dict[int, wsj.Tasks],
             key: Array, *, keep: dict | None = None) -> dict[int, dict[str, float]]:
    """Per task size n (``tasks[n]``: a batch of tasks of that size): ``item_f1``,
    ``critical_steps``, ``total_steps``, ``subagents`` (spawned), ``finished_subagents``
    (returned before their step limit), ``no_spawn_fraction``,
    ``answered`` (means over the batch). ``keep``, if given, receives
    ``{n: (tasks, result, seconds)}`` (e.g. to export traces), ``seconds`` the rollout's
    wall time until its results were ready, JAX compilation excluded
    (:func:`swarmjax.traces.timing.stopwatch`)."""
    from swarmjax.traces.timing import stopwatch

    out = {}
    for n, batch in tasks.items():
        batch = jax.tree.map(jnp.asarray, batch)
        with stopwatch() as clock:
            r = jax.block_until_ready(engine(params, worker_params, batch, jax.random.fold_in(key, 10_000 + n)))
        if keep is not None:
            keep[n] = (batch, r, clock["seconds"])
        f1 = item_f1(r.correct, r.answered, r.truth, r.end_reason == wsj.END_ANSWER)
        out[n] = {"item_f1": float(jnp.mean(f1)), "critical_steps": float(jnp.mean(r.critical_steps)),
                  "total_steps": float(jnp.mean(r.total_steps)), "subagents": float(jnp.mean(r.spawned)),
                  "finished_subagents": float(jnp.mean(r.finished)), "no_spawn_fraction": float(jnp.mean(r.spawned == 0)),
                  "answered": float(jnp.mean(r.end_reason == wsj.END_ANSWER))}
    return out
