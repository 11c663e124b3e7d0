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

Frozen trees (reference model, sub-agents) ride along in ``state.frozen`` with no
gradients and no optimizer state. With a mesh, the step is jitted with explicit
``in_shardings`` / ``out_shardings``: params and optimizer state by the logical
rule table, the batch over the data axes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from swarmjax.models.config import ModelConfig
from swarmjax.models.transformer import forward, param_logical_axes
from swarmjax.optim.muon import OptimConfig, make_optimizer
from swarmjax.optim.qk_clip import qk_clip
from swarmjax.rl.losses import LossConfig, batch_totals, policy_loss, token_logprobs
from swarmjax.rl.trajectory import TrajectoryBatch
from swarmjax.sharding.mesh import (DEFAULT_RULES, batch_sharding, state_shardings_like,
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

    def __post_init__(self):
        if self.num_minibatches < 1 or self.num_microbatches < 1:
            raise ValueError("num_minibatches and num_microbatches must be >= 1")


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
        self.optimizer = optimizer or make_optimizer(cfg.optim)
        self._update: dict[int, Callable] = {}

    # ------------------------------------------------------------------ sharding
    def _param_shardings(self, params):
        return tree_shardings(param_logical_axes(self.model_cfg), params, self.mesh, self.rules)

    def state_shardings(self, state: TrainState) -> TrainState:
        """NamedShardings of every leaf of ``state`` (requires a mesh)."""
        ps = self._param_shardings(state.params)
        replicated = NamedSharding(self.mesh, PartitionSpec())
        # frozen model copies shard like the params; anything else is replicated
        frozen = None if state.frozen is None else {
            k: (self._param_shardings(v) if _same_structure(v, state.params)
                else jax.tree.map(lambda _: replicated, v))
            for k, v in state.frozen.items()}
        return TrainState(step=replicated, params=ps,
                          opt_state=state_shardings_like(state.opt_state, state.params, ps, self.mesh),
                          frozen=frozen)

    # ------------------------------------------------------------------ state
    def init(self, params: Any, frozen: dict[str, Any] | None = None) -> TrainState:
        """Initial state; with a mesh every leaf is placed with its sharding.

        :meth:`update` donates the state's buffers, and without a mesh the state
        holds ``params`` itself: copy them first if you need the originals later."""
        state = TrainState(step=jnp.zeros((), jnp.int32), params=params,
                           opt_state=self.optimizer.init(params), frozen=frozen)
        if self.mesh is None:
            return state
        shardings = self.state_shardings(jax.eval_shape(lambda: state))
        return jax.tree.map(jax.device_put, state, shardings)

    # ------------------------------------------------------------------ the step
    def _logprobs(self, params, tokens, token_mask, want_max=False):
        out = forward(params, self.model_cfg, tokens, token_mask=token_mask,
                      return_max_logits=want_max)
        return token_logprobs(out.logits, tokens), out.max_logits

    def _loss(self, params, mb: TrajectoryBatch, old_logp, ref_logp, totals):
        want_max = self.cfg.optim.qk_clip_tau > 0
        logp, max_logits = self._logprobs(params, mb.tokens, mb.token_mask, want_max)
        loss, metrics = policy_loss(logp, old_logp, mb.advantages, mb.loss_mask, self.cfg.loss,
                                    sampler_logp=mb.sampler_logprobs, ref_logp=ref_logp, totals=totals)
        return loss, (metrics, max_logits)

    def _minibatch_step(self, carry, xs):
        params, opt_state = carry
        mb, old_logp, ref_logp = xs                         # [mb_size, T] each
        totals = batch_totals(mb.loss_mask)
        n_micro = self.cfg.num_microbatches
        micro = jax.tree.map(lambda x: _strided_split(x, n_micro), (mb, old_logp, ref_logp))
        grad_fn = jax.value_and_grad(self._loss, has_aux=True)

        def accumulate(acc, xs):
            m, old, ref = xs
            (loss, (metrics, max_logits)), grads = grad_fn(params, m, old, ref, totals)
            g_acc, l_acc, mx_acc = acc
            g_acc = jax.tree.map(jnp.add, g_acc, grads)
            if max_logits is not None:
                mx_acc = jnp.maximum(mx_acc, max_logits)
            return (g_acc, l_acc + loss, mx_acc), metrics

        L, H = self.model_cfg.num_layers, self.model_cfg.num_heads
        init = (jax.tree.map(jnp.zeros_like, params), jnp.zeros((), jnp.float32),
                jnp.full((L, H), -jnp.inf, jnp.float32))
        (grads, loss, max_logits), metrics = lax.scan(accumulate, init, micro)
        metrics = jax.tree.map(jnp.mean, metrics)

        grad_norm = optax.tree.norm(grads)
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)

        def apply(_):
            updates, new_opt = self.optimizer.update(grads, opt_state, params)
            new_params = optax.apply_updates(params, updates)
            clip_metrics = {}
            if self.cfg.optim.qk_clip_tau > 0:
                new_params, clip_metrics = qk_clip(new_params, max_logits, self.model_cfg,
                                                   tau=self.cfg.optim.qk_clip_tau,
                                                   alpha=self.cfg.optim.qk_clip_alpha)
            return new_params, new_opt, clip_metrics

        def skip(_):
            clip_metrics = {}
            if self.cfg.optim.qk_clip_tau > 0:
                clip_metrics = {"qk_clip_heads": jnp.zeros((), jnp.int32),
                                "max_attn_logit": jnp.max(max_logits)}
            return params, opt_state, clip_metrics

        params, opt_state, clip_metrics = lax.cond(finite, apply, skip, None)
        metrics.update(clip_metrics, loss=loss, grad_norm=grad_norm,
                       skipped=(~finite).astype(jnp.int32))
        return (params, opt_state), metrics

    def _update_impl(self, state: TrainState, batch: TrajectoryBatch):
        B = batch.batch_size
        n_mini, n_micro = self.cfg.num_minibatches, self.cfg.num_microbatches
        micro_size = B // (n_mini * n_micro)

        # 1. log pi_old (and log pi_ref) with the pre-update params, micro_size rows at a time
        chunks = jax.tree.map(lambda x: _strided_split(x, B // micro_size), (batch.tokens, batch.token_mask))

        def logp_of(params):
            per_chunk = lax.map(lambda c: self._logprobs(params, *c)[0], chunks)
            return _strided_merge(per_chunk)

        old_logp = lax.stop_gradient(logp_of(state.params))
        ref_logp = jnp.zeros_like(old_logp)
        if self.cfg.loss.kl_beta > 0:
            if not state.frozen or "reference" not in state.frozen:
                raise ValueError("loss.kl_beta > 0 needs state.frozen['reference'] params")
            ref_logp = lax.stop_gradient(logp_of(state.frozen["reference"]))

        # 2.-4. sequential minibatch steps
        xs = jax.tree.map(lambda x: _strided_split(x, n_mini), (batch, old_logp, ref_logp))
        (params, opt_state), metrics = lax.scan(self._minibatch_step,
                                                (state.params, state.opt_state), xs)
        skipped = jnp.sum(metrics.pop("skipped"))
        metrics = {k: (jnp.max(v) if k == "max_attn_logit" else jnp.mean(v)) for k, v in metrics.items()}
        metrics.update(skipped=skipped, reward_mean=jnp.mean(batch.rewards),
                       advantage_abs_mean=jnp.mean(jnp.abs(batch.advantages)))
        new_state = state.replace(step=state.step + n_mini - skipped, params=params,
                                  opt_state=opt_state)
        return new_state, metrics

    def update(self, state: TrainState, batch: TrajectoryBatch) -> tuple[TrainState, dict[str, Array]]:
        """One rollout batch -> ``num_minibatches`` optimizer steps. The input state's
        buffers are donated. Raises ValueError if B is not divisible by
        ``num_minibatches * num_microbatches``."""
        B = batch.batch_size
        per = self.cfg.num_minibatches * self.cfg.num_microbatches
        if B % per:
            raise ValueError(f"batch size {B} is not divisible by num_minibatches x "
                             f"num_microbatches = {per}")
        if B not in self._update:
            if self.mesh is None:
                self._update[B] = jax.jit(self._update_impl, donate_argnums=0)
            else:
                state_sh = self.state_shardings(state)
                batch_sh = jax.tree.map(lambda x: batch_sharding(self.mesh, x.ndim, rules=self.rules, batch_size=B), batch)
                self._update[B] = jax.jit(
                    self._update_impl, donate_argnums=0, in_shardings=(state_sh, batch_sh),
                    out_shardings=(state_sh, NamedSharding(self.mesh, PartitionSpec())))
        return self._update[B](state, batch)


def _strided_merge(x: Array) -> Array:
    """Inverse of :func:`_strided_split`: [n, B/n, ...] -> [B, ...]."""
    return jnp.swapaxes(x, 0, 1).reshape((-1,) + x.shape[2:])


def _same_structure(a: Any, b: Any) -> bool:
    return jax.tree.structure(a) == jax.tree.structure(b)
