"""Policy-gradient losses of the GSPO / GRPO family, as pure functions.

Every loss maps per-token log-probs to a *per-token objective* ``o [B, T]``;
one aggregation turns it into the scalar ``J`` and the loss is ``-J``. Notation
(docs/design.md section 8): mask ``m_{i,t}`` (policy-sampled tokens), ``|y_i| = sum_t m``,
token log-ratio ``l_{i,t} = log pi_theta - log pi_old`` on masked tokens.

* GSPO (Zheng et al. 2025, arXiv 2507.18071):
  ``s_i = exp(mean_t l_{i,t})``, ``o_i = min(s_i A_i, clip(s_i, 1-eps_l, 1+eps_h) A_i)``.
* GSPO-token: ``s_{i,t} = sg[s_i] * pi_theta(y_t) / sg[pi_theta(y_t)]`` with the same
  clipped form per token (value equals GSPO when ``A_{i,t} = A_i``).
* GRPO (Shao et al. 2024): ``r_{i,t} = exp(l_{i,t})``, clipped per token, optional
  ``- beta * KL_k3(pi_theta || pi_ref)`` with ``k3 = exp(q - p) - (q - p) - 1``.

Aggregations (:data:`AGGREGATIONS`): ``seq_mean_token_mean`` (mean over tokens of a
sequence, then over sequences: GSPO/GRPO), ``token_mean`` (sum over all tokens /
total tokens: DAPO), ``seq_mean_token_sum_norm`` (sum over tokens / a constant
length, then mean over sequences: Dr. GRPO). Each is ``J = numerator / normaliser``
(:class:`Aggregation`) with a numerator summed over rows and a normaliser from batch
totals, so a batch split into microbatches, each given the whole batch's totals, has
microbatch losses and gradients that sum to the batch's exactly.

Metrics come as (numerator, denominator) pairs (:func:`policy_loss_sums`), additive over
microbatches and divided once (:func:`metrics_from_sums`); :func:`policy_loss` returns
the divided metrics of one batch.

Optional importance weight between the learner's old policy and the sampler
(off-policy correction for a sampler whose weights or numerics differ from the
learner's: an asynchronous rollout's stale policy, an inference engine's kernels). With
``rho = exp(log pi_old - log pi_sampler)`` per token, or per sequence with the
length-normalised log-ratio ``exp(mean_t (log pi_old - log pi_sampler))``:

* ``is_mode="truncate"`` (TIS, Yao et al. 2025, "Your Efficient RL Framework Secretly
  Brings You Off-Policy RL Training"): ``w = min(rho, C)``;
* ``is_mode="mask"`` (MIS, Liu et al. 2025, "When Speed Kills Stability"):
  ``w = rho`` where ``is_floor <= rho <= C`` and 0 elsewhere (the token or sequence
  leaves the loss).

``w`` multiplies the objective as a constant (stop-gradient). The mismatch is logged as
``mismatch_kl``, the k3 estimate of KL(pi_sampler || pi_old) on the loss tokens (the
tokens are the sampler's samples), and ``is_clipped_fraction``, the loss tokens whose
weight was truncated or masked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

Array = jax.Array
sg = jax.lax.stop_gradient


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """Which loss and its knobs (frozen: a static jit argument)."""

    name: str = "gspo"                       # key of LOSSES
    eps_low: float = 3e-4                    # GSPO paper settings; GRPO uses 0.2 / 0.28 (DAPO)
    eps_high: float = 4e-4
    aggregation: str = "seq_mean_token_mean"  # key of AGGREGATIONS
    norm_length: int = 0                     # Dr. GRPO constant; 0 = the batch's T
    kl_beta: float = 0.0                     # weight of KL to the reference policy (k3)
    is_cap: float = 0.0                      # importance-weight cap C; 0 = off
    is_level: str = "token"                  # "token" | "sequence"
    is_mode: str = "truncate"                # key of IS_MODES: "truncate" (TIS) | "mask" (MIS)
    is_floor: float = 0.0                    # "mask": weights below this leave the loss too
    log_mismatch: bool = False               # log mismatch_kl even with no correction (is_cap = 0)

    def __post_init__(self):
        if self.name not in LOSSES:
            raise ValueError(f"unknown loss {self.name!r}; known: {sorted(LOSSES)}")
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"unknown aggregation {self.aggregation!r}; known: {sorted(AGGREGATIONS)}")
        if self.is_level not in ("token", "sequence"):
            raise ValueError(f"is_level must be 'token' or 'sequence', got {self.is_level!r}")
        if not (0 <= self.eps_low < 1 and self.eps_high >= 0):
            raise ValueError(f"need 0 <= eps_low < 1 and eps_high >= 0, got {self.eps_low}, {self.eps_high}")
        if self.kl_beta < 0 or self.is_cap < 0:
            raise ValueError("kl_beta and is_cap must be >= 0")
        if self.is_mode not in IS_MODES:
            raise ValueError(f"unknown is_mode {self.is_mode!r}; known: {sorted(IS_MODES)}")
        if self.is_floor < 0 or (self.is_cap > 0 and self.is_floor >= self.is_cap):
            raise ValueError(f"need 0 <= is_floor < is_cap, got {self.is_floor}, {self.is_cap}")


def _truncate(rho: Array, cfg: "LossConfig") -> tuple[Array, Array]:
    """TIS: ``min(rho, C)``, and where the cap binds."""
    return jnp.minimum(rho, cfg.is_cap), rho > cfg.is_cap


def _mask(rho: Array, cfg: "LossConfig") -> tuple[Array, Array]:
    """MIS: ``rho`` inside ``[is_floor, C]``, 0 outside (and where it is 0)."""
    out = (rho > cfg.is_cap) | (rho < cfg.is_floor)
    return jnp.where(out, 0.0, rho), out


# name -> (rho [B, T] or [B, 1], cfg) -> (weight, where it differs from rho), same shape
IS_MODES: dict[str, Callable] = {"truncate": _truncate, "mask": _mask}


# Named settings from the papers (docs/design.md section 8.5); pass overrides as keyword arguments.
LOSS_PRESETS: dict[str, dict] = {
    "gspo": dict(name="gspo", eps_low=3e-4, eps_high=4e-4, aggregation="seq_mean_token_mean"),
    "gspo_token": dict(name="gspo_token", eps_low=3e-4, eps_high=4e-4),
    "grpo": dict(name="grpo", eps_low=0.2, eps_high=0.2, aggregation="seq_mean_token_mean"),
    "dapo": dict(name="grpo", eps_low=0.2, eps_high=0.28, aggregation="token_mean"),
    "drgrpo": dict(name="grpo", eps_low=0.2, eps_high=0.2, aggregation="seq_mean_token_sum_norm"),
}


def loss_preset(name: str, **overrides) -> LossConfig:
    """``LossConfig`` with a paper's settings, e.g. ``loss_preset("dapo", kl_beta=0.01)``."""
    if name not in LOSS_PRESETS:
        raise ValueError(f"unknown loss preset {name!r}; known: {sorted(LOSS_PRESETS)}")
    return LossConfig(**{**LOSS_PRESETS[name], **overrides})


def token_logprobs(logits: Array, tokens: Array) -> Array:
    """``logp[b, t] = log softmax(logits[b, t-1])[tokens[b, t]]``, 0 at t = 0.

    logits: [B, T, V] (position t predicts token t+1); tokens: [B, T]. Returns [B, T] f32.
    """
    logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
    picked = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
    return jnp.pad(picked, ((0, 0), (1, 0)))


LOGITS_CHUNK_BYTES = 256 << 20     # the float32 logits of one chunk, at most (auto_logits_chunk)


def auto_logits_chunk(rows: int, vocab: int, *, budget: int = LOGITS_CHUNK_BYTES) -> int:
    """Positions per chunk of :func:`chunked_token_logprobs` so that one chunk's float32
    logits [rows, chunk, vocab] stay within ``budget`` bytes (at least 1): at a 152k
    vocabulary and 16 rows, 27 positions (256 MiB) instead of the whole rows' 5 GB at 512."""
    return max(1, budget // (4 * rows * vocab))


def chunked_token_logprobs(hidden: Array, head: Array, tokens: Array, *, chunk: int,
                           return_hits: bool = False) -> Array | tuple[Array, Array]:
    """:func:`token_logprobs` of ``logits = hidden @ head`` without the [B, T, V] logits.

    hidden: [B, T, D] final-normed states; head: [D, V]; tokens: [B, T]. The positions
    run ``chunk`` at a time (``lax.map``), each chunk's logits rematerialised in the
    backward pass (``jax.checkpoint``) and reduced at once to
    ``logits[token] - logsumexp(logits)``: peak memory B x chunk x V instead of several
    B x T x V float32 arrays (at a 152k vocabulary and 4096 tokens, 2.5 GB each per row).
    Returns [B, T] f32, 0 at t = 0; with ``return_hits`` also the bool [B, T] of
    ``argmax_v logits[t - 1] == tokens[t]`` (False at t = 0): a teacher-forced accuracy.
    """
    B, T, D = hidden.shape
    n = -(-T // chunk)
    pad = n * chunk - T
    # Chunk i holds positions c * n + i (strided): a sharding of T over devices (a
    # minibatch split by positions, sharding.mesh.rows_sharding) stays on the chunk's
    # own axis instead of the scanned one, which XLA would gather. Position t predicts
    # token t + 1 (the last position's target is a pad, dropped below).
    h = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0))).reshape(B, chunk, n, D).transpose(2, 0, 1, 3)
    tgt = jnp.pad(tokens[:, 1:], ((0, 0), (0, pad + 1))).reshape(B, chunk, n).transpose(2, 0, 1)

    @jax.checkpoint
    def one(args):
        hc, tc = args                                                        # [B, C, D], [B, C]: C = chunk
        logits = jnp.einsum("BCD,DV->BCV", hc, head.astype(hc.dtype), preferred_element_type=jnp.float32)
        picked = jnp.take_along_axis(logits, tc[..., None], axis=-1)[..., 0]
        hits = jnp.argmax(logits, axis=-1) == tc if return_hits else None
        return picked - jax.nn.logsumexp(logits, axis=-1), hits              # [B, chunk] each

    def unchunk(x):                                                          # [n, B, chunk] -> [B, T], t = 0 first
        return jnp.pad(x.transpose(1, 2, 0).reshape(B, n * chunk)[:, :T - 1], ((0, 0), (1, 0)))

    picked, hits = lax.map(one, (h, tgt))
    return (unchunk(picked), unchunk(hits)) if return_hits else unchunk(picked)


def _seq_mean(x: Array, mask: Array) -> Array:
    """[B, T] -> [B] mean over masked tokens (0 for empty rows)."""
    return jnp.sum(x * mask, axis=-1) / jnp.maximum(jnp.sum(mask, axis=-1), 1.0)


def _clip_min(ratio: Array, adv: Array, cfg: LossConfig) -> tuple[Array, Array]:
    """``min(ratio * A, clip(ratio, 1-eps_l, 1+eps_h) * A)`` and where the clip binds."""
    clipped_ratio = jnp.clip(ratio, 1.0 - cfg.eps_low, 1.0 + cfg.eps_high)
    obj = jnp.minimum(ratio * adv, clipped_ratio * adv)
    binds = ((adv > 0) & (ratio > 1.0 + cfg.eps_high)) | ((adv < 0) & (ratio < 1.0 - cfg.eps_low))
    return obj, binds


def _token_adv(adv: Array, shape) -> Array:
    return adv[:, None] * jnp.ones(shape) if adv.ndim == 1 else adv


def gspo_objective(logp, old_logp, adv, mask, cfg):
    """GSPO: one clipped sequence ratio per row, broadcast to the row's tokens."""
    if adv.ndim != 1:
        raise ValueError("GSPO takes one advantage per sequence: advantages [B]")
    s = jnp.exp(_seq_mean(logp - old_logp, mask))                   # [B]
    obj, binds = _clip_min(s, adv, cfg)
    shape = logp.shape
    return _token_adv(obj, shape), _token_adv(s, shape), _token_adv(binds, shape) > 0


def gspo_token_objective(logp, old_logp, adv, mask, cfg):
    """GSPO-token: ``s_{i,t} = sg[s_i] * exp(logp - sg[logp])`` clipped per token."""
    s = jnp.exp(_seq_mean(logp - old_logp, mask))                   # [B]
    s_tok = sg(s)[:, None] * jnp.exp(logp - sg(logp))               # [B, T], value s_i
    obj, binds = _clip_min(s_tok, _token_adv(adv, logp.shape), cfg)
    return obj, s_tok, binds


def grpo_objective(logp, old_logp, adv, mask, cfg):
    """GRPO / PPO-clip per token: ``r_{i,t} = exp(logp - old_logp)``."""
    ratio = jnp.exp(logp - old_logp)
    obj, binds = _clip_min(ratio, _token_adv(adv, logp.shape), cfg)
    return obj, ratio, binds


# name -> objective(logp, old_logp, advantages, mask, cfg) -> (obj, ratio, clip_binds), each [B, T]
LOSSES: dict[str, Callable] = {
    "gspo": gspo_objective,
    "gspo_token": gspo_token_objective,
    "grpo": grpo_objective,
}


class Aggregation(NamedTuple):
    """How the per-token objective ``o [B, T]`` becomes ``J = numerator / normaliser``.

    numerator(obj [B, T], mask [B, T]) -> []: a sum over rows, so it is additive over
      any split of the batch's rows;
    normaliser(totals, length, cfg) -> []: from the batch totals ``(N_seq, N_tok)`` of
      :func:`batch_totals` and the padded length ``T``; also additive over row splits.
    ``J = numerator / max(normaliser, 1)`` (0 for a batch with no loss token).
    """

    numerator: Callable[[Array, Array], Array]
    normaliser: Callable[[tuple[Array, Array], int, "LossConfig"], Array]


def _sum_of_seq_means(obj, mask):
    """``sum_i (1/|y_i|) sum_t m_{i,t} o_{i,t}`` (rows with no loss token give 0)."""
    return jnp.sum(_seq_mean(obj, mask))


def _masked_sum(obj, mask):
    """``sum_{i,t} m_{i,t} o_{i,t}``."""
    return jnp.sum(obj * mask)


# name -> Aggregation; N_seq = rows with >= 1 loss token, N_tok = loss tokens, L = norm length
AGGREGATIONS: dict[str, Aggregation] = {
    # GSPO / GRPO: J = sum_i mean_t o_{i,t} / N_seq
    "seq_mean_token_mean": Aggregation(_sum_of_seq_means, lambda totals, length, cfg: totals[0]),
    # DAPO: J = sum_{i,t} m o / N_tok
    "token_mean": Aggregation(_masked_sum, lambda totals, length, cfg: totals[1]),
    # Dr. GRPO: J = sum_{i,t} m o / (N_seq * L), L = cfg.norm_length or T
    "seq_mean_token_sum_norm": Aggregation(
        _masked_sum, lambda totals, length, cfg: totals[0] * (cfg.norm_length or length)),
}


def k3(log_p: Array, log_q: Array) -> Array:
    """Schulman's k3 estimator of KL(p || q) from samples of p: ``exp(q-p) - (q-p) - 1`` (>= 0)."""
    d = log_q - log_p
    return jnp.exp(d) - d - 1.0


def batch_totals(mask: Array) -> tuple[Array, Array]:
    """``(N_seq, N_tok)`` of a batch: rows with >= 1 loss token, and loss tokens.

    mask: [B, T]. Returns two f32 scalars, each additive over any split of the rows.
    Pass the totals of a whole minibatch when computing the loss per microbatch so
    the microbatch losses (and gradients) sum to the minibatch's exactly."""
    mask = mask.astype(jnp.float32)
    return jnp.sum(jnp.sum(mask, -1) > 0).astype(jnp.float32), jnp.sum(mask)


# A metric as (numerator, denominator), both f32 scalars; its value is
# numerator / max(denominator, 1). Sums of pairs over disjoint row sets give the pair of
# their union, so metrics accumulate exactly over microbatches: add, then divide once.
MetricSums = dict[str, tuple[Array, Array]]


def policy_loss_sums(logp: Array, old_logp: Array, advantages: Array, mask: Array, cfg: LossConfig, *,
                     sampler_logp: Array | None = None, ref_logp: Array | None = None,
                     totals: tuple[Array, Array] | None = None) -> tuple[Array, MetricSums]:
    """The scalar loss ``-J`` and the metrics as additive (numerator, denominator) pairs.

    Arguments as in :func:`policy_loss`. The loss is
    ``-numerator / max(normaliser(totals), 1)`` (:class:`Aggregation`), so with the
    totals of a larger batch it is this batch's share of that batch's loss. The metric
    pairs describe this batch alone and do not depend on ``totals``
    (``m`` = loss mask, ``N_tok = sum m``):

    * ``objective``: (aggregation numerator, normaliser of this batch's own totals): J;
    * ``clip_fraction``: (sum m * [clip binds], N_tok);
    * ``ratio_mean``: (sum m * ratio, N_tok), ratio as in the objective (GSPO: s_i per token);
    * ``approx_kl``: (sum m * k3(pi_theta || pi_old), N_tok);
    * ``kl_ref`` (``kl_beta > 0``): (sum m * k3(pi_theta || pi_ref), N_tok);
    * ``is_weight_mean``, ``is_clipped_fraction`` (``is_cap > 0``): (sum m * w, N_tok),
      (sum m * [w truncated or masked], N_tok);
    * ``mismatch_kl`` (``is_cap > 0`` or ``log_mismatch``): (sum m * k3(pi_sampler ||
      pi_old), N_tok).

    Summing the pairs over the microbatches of a batch and dividing once
    (:func:`metrics_from_sums`) gives the batch's metrics exactly; a mean of
    per-microbatch means would weight microbatches equally whatever their token count.
    """
    mask = mask.astype(jnp.float32)                                      # [B, T]
    old_logp = sg(old_logp)
    advantages = sg(advantages.astype(jnp.float32))                      # [B] or [B, T]
    own_totals = batch_totals(mask)
    totals = own_totals if totals is None else totals
    obj, ratio, binds = LOSSES[cfg.name](logp, old_logp, advantages, mask, cfg)  # [B, T] each
    n_tok = own_totals[1]
    token_sum = lambda x: (jnp.sum(x * mask), n_tok)                     # x [B, T] -> pair
    sums: MetricSums = {}
    if cfg.is_cap > 0 or cfg.log_mismatch:
        if sampler_logp is None:
            raise ValueError("is_cap > 0 and log_mismatch need sampler_logp")
        sums["mismatch_kl"] = token_sum(k3(sg(sampler_logp), old_logp))
    if cfg.is_cap > 0:
        diff = old_logp - sg(sampler_logp)                               # [B, T]
        if cfg.is_level == "sequence":
            diff = _seq_mean(diff, mask)[:, None]                        # [B, 1]
        w, changed = IS_MODES[cfg.is_mode](jnp.exp(diff), cfg)           # [B, T] or [B, 1]
        w = w * jnp.ones_like(obj)                                       # [B, T]
        obj = obj * w
        sums["is_weight_mean"] = token_sum(w)
        sums["is_clipped_fraction"] = token_sum(changed * jnp.ones_like(obj))
    if cfg.kl_beta > 0:
        if ref_logp is None:
            raise ValueError("kl_beta > 0 needs ref_logp")
        kl = k3(logp, sg(ref_logp))                                      # [B, T]
        obj = obj - cfg.kl_beta * kl
        sums["kl_ref"] = token_sum(sg(kl))
    agg = AGGREGATIONS[cfg.aggregation]
    numerator = agg.numerator(obj, mask)                                 # []
    J = numerator / jnp.maximum(agg.normaliser(totals, obj.shape[1], cfg), 1.0)
    sums.update(
        objective=(sg(numerator), agg.normaliser(own_totals, obj.shape[1], cfg)),
        clip_fraction=token_sum(binds.astype(jnp.float32)),
        ratio_mean=token_sum(sg(ratio)),
        approx_kl=token_sum(k3(sg(logp), old_logp)),
    )
    return -J, sums


def metrics_from_sums(sums: MetricSums) -> dict[str, Array]:
    """``{name: numerator / max(denominator, 1)}``: an empty mean is 0."""
    return {k: num / jnp.maximum(den, 1.0) for k, (num, den) in sums.items()}


def policy_loss(logp: Array, old_logp: Array, advantages: Array, mask: Array, cfg: LossConfig, *,
                sampler_logp: Array | None = None, ref_logp: Array | None = None,
                totals: tuple[Array, Array] | None = None) -> tuple[Array, dict[str, Array]]:
    """The scalar loss ``-J`` and metrics.

    Args:
      logp: [B, T] log pi_theta of each token (differentiated).
      old_logp: [B, T] log pi_old (constant).
      advantages: [B] per sequence, or [B, T] per token (not for plain GSPO).
      mask: [B, T] loss mask (1 on policy-sampled tokens).
      cfg: :class:`LossConfig`.
      sampler_logp: [B, T] sampler log-probs; needed when ``cfg.is_cap > 0``.
      ref_logp: [B, T] reference-policy log-probs; needed when ``cfg.kl_beta > 0``.
      totals: (N_seq, N_tok) normalisers of the loss; default :func:`batch_totals` of ``mask``.

    Returns:
      (loss, metrics), metrics scalars of this batch alone (whatever ``totals``):
      ``objective`` (J with this batch's own totals), and means over loss tokens of
      ``clip_fraction``, ``ratio_mean``, ``approx_kl`` (k3 of pi_theta vs pi_old), and
      ``kl_ref`` / ``is_weight_mean`` when enabled. Rows with no loss token contribute
      nothing. To accumulate metrics over microbatches use :func:`policy_loss_sums`.
    """
    loss, sums = policy_loss_sums(logp, old_logp, advantages, mask, cfg, sampler_logp=sampler_logp,
                                  ref_logp=ref_logp, totals=totals)
    return loss, metrics_from_sums(sums)
