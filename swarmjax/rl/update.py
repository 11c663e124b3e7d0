"""The learner step: ``update(state, batch) -> (state, metrics)``, one ``jax.jit``.

Per rollout batch of B trajectories:

1. ``log pi_old`` (and ``log pi_ref`` when the loss has a KL term) for every token,
   computed once with the pre-update params, microbatch by microbatch (``lax.map``);
2. ``num_minibatches`` sequential optimizer steps (``lax.scan``); each minibatch's
   gradient is accumulated over ``num_microbatches`` (inner ``lax.scan``) with the
   minibatch's loss normalisers, so the accumulated gradient equals the full
   minibatch gradient exactly;
3. after each optimizer step, QK-Clip with the max attention logits seen in that
   step's forward passes;
4. a step whose loss or gradient is not finite is skipped: params and optimizer
   state stay as they were and ``skipped`` counts it. (``optax.apply_if_finite``
   checks gradients only, gives up after N bad steps and cannot gate QK-Clip,
   hence our own ``lax.cond``.)
5. metrics are accumulated exactly: the loss returns (numerator, denominator) pairs
   (:func:`~swarmjax.rl.losses.policy_loss_sums`) that are summed over microbatches
   and over the applied steps and divided once, so they equal those of the
   un-microbatched update; a skipped step is counted in ``skipped`` and left out of
   every other metric (see :meth:`Learner._update_impl`).

Frozen trees (reference model, sub-agents) ride along in ``state.frozen`` with no
gradients and no optimizer state. With a mesh, the step is jitted with explicit
``in_shardings`` / ``out_shardings``: params and optimizer state by the logical
rule table, the batch over the data axes.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import optax
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from swarmjax.models.config import ModelConfig
from swarmjax.models.lora import frozen_part, over_base
from swarmjax.models.remat import remat_policy
from swarmjax.models.transformer import forward, forward_after_head, output_head, param_logical_axes
from swarmjax.optim.muon import OptimConfig, make_optimizer
from swarmjax.optim.qk_clip import qk_clip
from swarmjax.rl.advantages import ADVANTAGES
from swarmjax.rl.losses import (LossConfig, MetricSums, auto_logits_chunk, batch_totals, chunked_token_logprobs,
                                metrics_from_sums, policy_loss_sums, token_logprobs)
from swarmjax.rl.trajectory import TrajectoryBatch
from swarmjax.sharding.mesh import (DEFAULT_RULES, batch_sharding, rows_sharding, state_shardings_like,
                                    tree_shardings)

Array = jax.Array


@flax.struct.dataclass
class TrainState:
    """step: optimizer steps taken; params: trained; opt_state: optax state;
    frozen: any pytree carried through untouched (e.g. ``{"reference": params}``)."""

    step: Array
    params: Any
    opt_state: Any
    frozen: Any = None


@dataclasses.dataclass(frozen=True)
class UpdateConfig:
    """How one rollout batch becomes optimizer steps."""

    loss: LossConfig = LossConfig()
    optim: OptimConfig = OptimConfig()
    num_minibatches: int = 4      # GSPO paper: rollout batch split into 4 minibatches
    num_microbatches: int = 1     # gradient accumulation inside each minibatch
    # per-layer rematerialisation of the forward (models.remat): "dots" keeps the weight matmuls'
    # outputs and recomputes attention scores and elementwise ops
    remat: str = "dots"
    # log-probs this many positions at a time (losses.chunked_token_logprobs); None: as many as keep a
    # chunk's float32 logits within losses.LOGITS_CHUNK_BYTES for the microbatch's rows; 0: all at once
    logits_chunk: int | None = None

    def __post_init__(self):
        if self.num_minibatches < 1 or self.num_microbatches < 1:
            raise ValueError("num_minibatches and num_microbatches must be >= 1")
        remat_policy(self.remat)          # a clear error for an unknown name, at config time
        if self.logits_chunk is not None and self.logits_chunk < 0:
            raise ValueError(f"logits_chunk must be >= 0, got {self.logits_chunk}")

    @property
    def splits(self) -> int:
        """``num_minibatches * num_microbatches``: a batch's row count must be a multiple."""
        return self.num_minibatches * self.num_microbatches


def check_group_batch(advantage: str, tasks_per_step: int, group_size: int, update: UpdateConfig) -> None:
    """An RL stage's config checks: ``advantage`` a key of
    :data:`~swarmjax.rl.advantages.ADVANTAGES`, and its rollout batch of
    ``tasks_per_step x group_size`` rows a multiple of ``update.splits``."""
    if advantage not in ADVANTAGES:
        raise ValueError(f"unknown advantage {advantage!r}; known: {sorted(ADVANTAGES)}")
    if (tasks_per_step * group_size) % update.splits:
        raise ValueError(f"tasks_per_step x group_size = {tasks_per_step * group_size} is not divisible by "
                         f"num_minibatches x num_microbatches = {update.splits}")


class _StepCarry(NamedTuple):
    """Carry of the minibatch scan: what one optimizer step changes."""

    params: Any          # pytree of trained params
    opt_state: Any       # optax state


class _MicroCarry(NamedTuple):
    """Carry of the microbatch scan inside one minibatch."""

    grads: Any           # pytree like params: sum of microbatch gradients
    max_logits: Array    # [L, N] f32: running max of attention logits (QK-Clip)


class _StepReport(NamedTuple):
    """What one minibatch step reports (stacked to [n_mini] by the scan).

    pairs: metric -> (numerator, denominator), [] f32 each, both 0 for a skipped step:
      token rates as (sum over loss tokens, loss tokens); per-step figures (loss,
      objective, grad_norm, qk_clip_heads) as (value, 1).
    skipped: [] int32, 1 when the step was skipped.
    max_attn_logit: [] f32, -inf when skipped; None without QK-Clip.
    """

    pairs: MetricSums
    skipped: Array
    max_attn_logit: Array | None


def _strided_split(x: Array, n: int) -> Array:
    """[B, ...] -> [n, B/n, ...] with chunk i = rows i, i+n, i+2n, ...: when B is
    sharded in contiguous blocks over devices, every chunk is spread over all of
    them (a contiguous split would put a whole minibatch on a few devices)."""
    return jnp.swapaxes(x.reshape((x.shape[0] // n, n) + x.shape[1:]), 0, 1)


class Learner:
    """Builds the optimizer, initial state and the jitted ``update`` for one model.

    >>> learner = Learner(model_cfg, UpdateConfig(), mesh=mesh)
    >>> state = learner.init(params, frozen={"reference": ref_params})
    >>> state, metrics = learner.update(state, batch)
    """

    def __init__(self, model_cfg: ModelConfig, cfg: UpdateConfig = UpdateConfig(), *,
                 mesh: Mesh | None = None, rules=DEFAULT_RULES,
                 optimizer: optax.GradientTransformation | None = None):
        self.model_cfg, self.cfg, self.mesh, self.rules = model_cfg, cfg, mesh, rules
        self.optimizer = optimizer or make_optimizer(cfg.optim, mesh=mesh, lora=model_cfg.lora)  # LoRA: adapters
        self._update: dict[tuple[int, int | None], Callable] = {}

    # ------------------------------------------------------------------ sharding
    def _param_shardings(self, params):
        return tree_shardings(param_logical_axes(self.model_cfg), params, self.mesh, self.rules)

    def state_shardings(self, state: TrainState) -> TrainState:
        """NamedShardings of every leaf of ``state`` (requires a mesh)."""
        ps = self._param_shardings(state.params)
        replicated = NamedSharding(self.mesh, PartitionSpec())
        # frozen model copies shard like the params (LoRA: adapters alone, like the params'
        # adapters); anything else is replicated
        def frozen_shardings(v):
            if _same_structure(v, state.params):
                return self._param_shardings(v)
            if isinstance(v, dict) and set(v) == {"lora"} and _same_structure(v, frozen_part(state.params)):
                return {"lora": ps["lora"]}
            return jax.tree.map(lambda _: replicated, v)
        frozen = None if state.frozen is None else {k: frozen_shardings(v) for k, v in state.frozen.items()}
        return TrainState(step=replicated, params=ps,
                          opt_state=state_shardings_like(state.opt_state, state.params, ps, self.mesh),
                          frozen=frozen)

    # ------------------------------------------------------------------ state
    def init(self, params: Any, frozen: dict[str, Any] | None = None) -> TrainState:
        """Initial state; with a mesh every leaf is placed with its sharding, without one
        on the first local device (committed there).

        :meth:`update` donates the state's buffers, and without a mesh the state
        holds ``params`` itself: copy them first if you need the originals later.
        Raises ValueError when a ``frozen`` tree holds an array of ``params`` (the
        update would donate it while the frozen copy still reads it: pass a copy,
        ``jax.tree.map(jnp.copy, params)``)."""
        concrete = lambda tree: [x for x in jax.tree.leaves(tree)        # noqa: E731  (tracers: nothing donated)
                                 if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer)]
        mine = {id(x) for x in concrete(params)}
        for name, tree in (frozen or {}).items():
            if any(id(x) in mine for x in concrete(tree)):
                raise ValueError(f"frozen[{name!r}] shares arrays with the params being trained; freeze a copy "
                                 "(jax.tree.map(jnp.copy, params)): the update donates the trained ones")
        state = TrainState(step=jnp.zeros((), jnp.int32), params=params,
                           opt_state=self.optimizer.init(params), frozen=frozen)
        if self.mesh is None:
            # committed to the first local device, as a restored checkpoint's arrays are: a
            # fresh run and a resumed one then compile the same programs (jit specialises
            # on committed vs uncommitted inputs; the persistent compilation cache hits)
            return jax.device_put(state, jax.local_devices()[0])
        shardings = self.state_shardings(jax.eval_shape(lambda: state))
        return jax.tree.map(jax.device_put, state, shardings)

    # ------------------------------------------------------------------ the step
    def _rows(self, x: Array) -> Array:
        """``x`` [B, T] with its rows split over the mesh's data axes, or its positions when a
        microbatch has fewer rows than they have devices (:func:`rows_sharding`; no-op
        without a mesh)."""
        if self.mesh is None:
            return x
        return lax.with_sharding_constraint(x, rows_sharding(self.mesh, x.shape, rules=self.rules))

    def _logprobs(self, params, tokens, token_mask, want_max=False, head=None):
        """log p of every row id [B, T] (0 at column 0) and the attention max logits [L, N]
        (None unless ``want_max``). With a shared ``head`` [P] the rows continue it: the
        head runs once as a batch of one and every row attends over its keys and values
        (:func:`~swarmjax.models.transformer.forward_after_head`): P + B T positions instead
        of B (P + T), the same values and gradients (``remat`` does not apply to it)."""
        tokens, token_mask = self._rows(tokens), self._rows(token_mask)
        B, T = tokens.shape
        act = None if self.mesh is None else rows_sharding(self.mesh, (B, T, 1), rules=self.rules)
        chunk = self.cfg.logits_chunk
        if chunk is None:
            chunk = auto_logits_chunk(B, self.model_cfg.vocab_size)
        chunked = bool(chunk and chunk < T - 1)     # long sequences: never the whole [B, T, V] logits
        kw = dict(token_mask=token_mask, return_max_logits=want_max, activation_sharding=act,
                  return_hidden=chunked)
        if head is None:
            out = forward(params, self.model_cfg, tokens, remat=self.cfg.remat, **kw)
        else:
            out = forward_after_head(params, self.model_cfg, head, tokens, **kw)
        if chunked:
            logp = chunked_token_logprobs(out.hidden, output_head(params), tokens, chunk=chunk)
        else:
            logp = token_logprobs(out.logits, tokens)
        return self._rows(logp), out.max_logits

    def _loss(self, params, mb: TrajectoryBatch, old_logp, ref_logp, totals, head=None):
        """One microbatch: (loss with the minibatch's ``totals``, (metric sums, max logits [L, N]))."""
        want_max = self.cfg.optim.qk_clip_tau > 0
        logp, max_logits = self._logprobs(params, mb.tokens, mb.token_mask, want_max, head)
        loss, sums = policy_loss_sums(logp, old_logp, mb.advantages, mb.loss_mask, self.cfg.loss,
                                      sampler_logp=mb.sampler_logprobs, ref_logp=ref_logp,
                                      totals=totals)
        return loss, (sums, max_logits)

    def _minibatch_step(self, carry: _StepCarry, xs, *, head=None) -> tuple[_StepCarry, _StepReport]:
        """One optimizer step on one minibatch, its gradient accumulated over microbatches.

        xs: (minibatch, log pi_old, log pi_ref), [mb_size, ...] each; ``head`` [P]: the
        rows' shared head, or None. Returns the new carry and the step's
        :class:`_StepReport` (all pairs zero when skipped)."""
        params, opt_state = carry
        mb, old_logp, ref_logp = xs                         # [mb_size, T] each
        totals = batch_totals(mb.loss_mask)                 # the minibatch's normalisers
        n_micro = self.cfg.num_microbatches
        micro = jax.tree.map(lambda x: _strided_split(x, n_micro), (mb, old_logp, ref_logp))
        grad_fn = jax.value_and_grad(self._loss, has_aux=True)

        def accumulate(acc: _MicroCarry, xs) -> tuple[_MicroCarry, tuple[Array, MetricSums]]:
            m, old, ref = xs                                # [micro_size, T] each
            with jax.named_scope("learner_microbatch"):
                (loss, (sums, max_logits)), grads = grad_fn(params, m, old, ref, totals, head)
            if max_logits is not None:
                acc = acc._replace(max_logits=jnp.maximum(acc.max_logits, max_logits))
            return acc._replace(grads=jax.tree.map(jnp.add, acc.grads, grads)), (loss, sums)

        L, H = self.model_cfg.num_layers, self.model_cfg.num_heads
        init = _MicroCarry(grads=jax.tree.map(jnp.zeros_like, params),
                           max_logits=jnp.full((L, H), -jnp.inf, jnp.float32))
        acc, (losses, sums) = lax.scan(accumulate, init, micro)   # losses [n_micro], sums pairs [n_micro]
        # exact accumulation: the microbatch losses carry the minibatch's normalisers, so
        # they sum to its loss; metric numerators and denominators sum to the minibatch's
        loss = jnp.sum(losses)                                    # []
        sums = jax.tree.map(lambda x: jnp.sum(x, axis=0), sums)   # pairs of []
        grads, max_logits = acc.grads, acc.max_logits

        grad_norm = optax.tree.norm(grads)
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)

        def apply(_):
            updates, new_opt = self.optimizer.update(grads, opt_state, params)
            new_params = optax.apply_updates(params, updates)
            heads = jnp.zeros((), jnp.int32)
            if self.cfg.optim.qk_clip_tau > 0:
                new_params, clip = qk_clip(new_params, max_logits, self.model_cfg,
                                           tau=self.cfg.optim.qk_clip_tau,
                                           alpha=self.cfg.optim.qk_clip_alpha)
                heads = clip["qk_clip_heads"].astype(jnp.int32)
            return new_params, new_opt, heads

        def skip(_):
            return params, opt_state, jnp.zeros((), jnp.int32)

        params, opt_state, heads = lax.cond(finite, apply, skip, None)

        # a skipped step's figures (possibly NaN) stay out of every mean: where, not *
        applied = finite.astype(jnp.float32)
        keep = lambda x: jnp.where(finite, x, 0.0)
        objective = metrics_from_sums({"objective": sums.pop("objective")})["objective"]
        per_step = {"loss": loss, "objective": objective, "grad_norm": grad_norm}
        if self.cfg.optim.qk_clip_tau > 0:
            per_step["qk_clip_heads"] = heads.astype(jnp.float32)
        pairs: MetricSums = {k: (keep(n), keep(d)) for k, (n, d) in sums.items()}   # token rates
        pairs.update({k: (keep(v), applied) for k, v in per_step.items()})        # step means
        report = _StepReport(
            pairs=pairs, skipped=(~finite).astype(jnp.int32),
            max_attn_logit=(jnp.where(finite, jnp.max(max_logits), -jnp.inf)
                            if self.cfg.optim.qk_clip_tau > 0 else None))
        return _StepCarry(params, opt_state), report

    def _update_impl(self, state: TrainState, batch: TrajectoryBatch, head: Array | None = None):
        """Metrics of the update (skipped steps are counted and left out of all others):

        * ``skipped``: number of skipped (non-finite) steps;
        * ``loss``, ``objective``, ``grad_norm``, ``qk_clip_heads``: means over the
          applied steps of each step's figure (one step = one minibatch, exact however
          many microbatches it is split into);
        * ``clip_fraction``, ``ratio_mean``, ``approx_kl``, ``kl_ref``,
          ``is_weight_mean``: means over every loss token of the applied steps
          (numerators and denominators summed over microbatches and steps, divided once);
        * ``max_attn_logit``: max over the applied steps;
        * ``reward_mean``, ``advantage_abs_mean``: of the whole input batch.

        With no applied step, the means are 0 (as an empty mean in the losses) and
        ``max_attn_logit`` is 0."""
        B = batch.batch_size
        n_mini, n_micro = self.cfg.num_minibatches, self.cfg.num_microbatches
        micro_size = B // (n_mini * n_micro)

        # 1. log pi_old (and log pi_ref) with the pre-update params, micro_size rows at a time
        chunks = jax.tree.map(lambda x: _strided_split(x, B // micro_size), (batch.tokens, batch.token_mask))

        def logp_of(params):
            per_chunk = lax.map(lambda c: self._logprobs(params, *c, False, head)[0], chunks)
            return _strided_merge(per_chunk)

        old_logp = lax.stop_gradient(logp_of(state.params))
        ref_logp = jnp.zeros_like(old_logp)
        if self.cfg.loss.kl_beta > 0:
            if not state.frozen or "reference" not in state.frozen:
                raise ValueError("loss.kl_beta > 0 needs state.frozen['reference'] params")
            ref_logp = lax.stop_gradient(logp_of(over_base(state.frozen["reference"], state.params)))

        # 2.-4. sequential minibatch steps; per-step outputs stacked: [n_mini] each
        xs = jax.tree.map(lambda x: _strided_split(x, n_mini), (batch, old_logp, ref_logp))
        (params, opt_state), steps = lax.scan(partial(self._minibatch_step, head=head),
                                              _StepCarry(state.params, state.opt_state), xs)
        skipped = jnp.sum(steps.skipped)                                       # []
        summed = jax.tree.map(lambda x: jnp.sum(x, axis=0), steps.pairs)       # pairs of []
        metrics = metrics_from_sums(summed)                                    # divide once
        if steps.max_attn_logit is not None:
            mx = jnp.max(steps.max_attn_logit)
            metrics["max_attn_logit"] = jnp.where(skipped < n_mini, mx, 0.0)
        metrics.update(skipped=skipped, reward_mean=jnp.mean(batch.rewards),
                       advantage_abs_mean=jnp.mean(jnp.abs(batch.advantages)))
        new_state = state.replace(step=state.step + n_mini - skipped, params=params,
                                  opt_state=opt_state)
        return new_state, metrics

    def update(self, state: TrainState, batch: TrajectoryBatch, *, head: Array | None = None
               ) -> tuple[TrainState, dict[str, Array]]:
        """One rollout batch -> ``num_minibatches`` optimizer steps. The input state's
        buffers are donated. Raises ValueError if B is not divisible by
        ``num_minibatches * num_microbatches``.

        ``head`` [P] int: ids every row of ``batch`` continues (the rows hold the rest:
        :meth:`TrajectoryBatch.split_head` of a batch, with the length from
        :func:`~swarmjax.rl.trajectory.shared_head`). It runs once per forward instead of
        once per row; values and gradients are the same as for the rows
        ``[head, tokens_b]`` (tested), and one step is compiled per (B, P)."""
        B = batch.batch_size
        if B % self.cfg.splits:
            raise ValueError(f"batch size {B} is not divisible by num_minibatches x "
                             f"num_microbatches = {self.cfg.splits}")
        key = (B, None if head is None else int(head.shape[0]))
        if key not in self._update:
            rows, T = B // self.cfg.splits, batch.tokens.shape[1]
            if (self.mesh is not None and any(batch_sharding(self.mesh, 1, rules=self.rules).spec)
                    and not any(rows_sharding(self.mesh, (rows, T), rules=self.rules).spec)):
                warnings.warn(f"a microbatch of {rows} rows x {T} tokens splits over neither its rows nor its "
                              f"positions on this mesh's data axes, so every device computes all of it: use "
                              f"fewer minibatches x microbatches, or rows or tokens a multiple of the data axes' "
                              f"device count", stacklevel=2)
            if self.mesh is None:
                self._update[key] = jax.jit(self._update_impl, donate_argnums=0)
            else:
                state_sh = self.state_shardings(state)
                batch_sh = jax.tree.map(lambda x: batch_sharding(self.mesh, x.ndim, rules=self.rules, batch_size=B), batch)
                replicated = NamedSharding(self.mesh, PartitionSpec())
                self._update[key] = jax.jit(
                    self._update_impl, donate_argnums=0, in_shardings=(state_sh, batch_sh, replicated),
                    out_shardings=(state_sh, replicated))
        return self._update[key](state, batch, None if head is None else jnp.asarray(head, jnp.int32))


def _strided_merge(x: Array) -> Array:
    """Inverse of :func:`_strided_split`: [n, B/n, ...] -> [B, ...]."""
    return jnp.swapaxes(x, 0, 1).reshape((-1,) + x.shape[2:])


def _same_structure(a: Any, b: Any) -> bool:
    return jax.tree.structure(a) == jax.tree.structure(b)
