"""The warm start: supervised fine-tuning on scripted demonstrations, one step for every job.

:func:`sft_step` is the warm-start step of every job (the token world's two roles, the
agent job's one role, or two with their shared heads (``sft.per_role``), on a mesh or
not): a masked next-token loss where only the tokens the acting agent said count, never
the prompt or the environment's tokens, summed over the roles' token means. For the
token world's two roles, a batch of orchestrator trajectories ``[Bo, C]`` and one of
worker trajectories ``[Bw, W]``::

    L = mean_{t in said(orch)} -log p(x_t | x_<t) + mean_{t in said(worker)} -log p(x_t | x_<t)

(per-role means, so the long orchestrator contexts do not drown the short worker
ones). The optimizer is the same Muon/AdamW split as the RL stage
(:func:`swarmjax.optim.make_optimizer`), followed by QK-Clip as there.
:func:`warm_start_loop` is the one loop over that step, any number of roles, each with
its batch drawn from its demonstrations (:class:`RoleRows`): :func:`train_sft` (the token
world), :func:`swarmjax.train.agent.warm_start` (one role, or two with ``per_role``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from swarmjax.envs.widesearch import WideSearchConfig
from swarmjax.models.config import ModelConfig
from swarmjax.models.transformer import forward, forward_after_head, output_head, param_logical_axes
from swarmjax.optim import OptimConfig, make_optimizer, qk_clip
from swarmjax.rl.losses import auto_logits_chunk, chunked_token_logprobs, token_logprobs
from swarmjax.sharding.mesh import batch_sharding, rows_sharding, state_shardings_like, tree_shardings
from swarmjax.train.demos import Demos, make_demos
from swarmjax.train.distributed import global_whole

Array = jax.Array
ROLES = ("orch", "worker")            # the token world's two roles, each its own batch and mean


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    steps: int = 300
    batch: int = 16                    # trajectories per role per step
    demos: int = 2048                  # demonstration episodes (train split)
    eval_demos: int = 128              # held-out episodes for the per-role accuracy
    spawn_fraction: float = 0.25       # demonstrations that delegate (random chunks)
    max_chunk: int = 3                 # delegated chunk sizes are uniform in 1..max_chunk
    bucket: int = 32                   # orchestrator batches are cut to a multiple of this length
    optim: OptimConfig = OptimConfig(learning_rate=3e-3, warmup_steps=20, decay_steps=300)
    seed: int = 0

    def __post_init__(self):
        if self.steps < 1 or self.batch < 1 or self.demos < 1:
            raise ValueError("steps, batch and demos must be >= 1")
        if not 0.0 <= self.spawn_fraction <= 1.0:
            raise ValueError(f"spawn_fraction must be in [0, 1], got {self.spawn_fraction}")
        if self.max_chunk < 1 or self.bucket < 1:
            raise ValueError(f"max_chunk and bucket must be >= 1, got {self.max_chunk}, {self.bucket}")


def role_stats(params: Any, cfg: ModelConfig, tokens: Array, token_mask: Array,
               loss_mask: Array) -> tuple[Array, Array, Array]:
    """Masked next-token statistics of one role's batch [B, T]: (sum of -log p, number of
    loss tokens, number predicted right by argmax)."""
    return _role_stats(params, cfg, tokens, token_mask, loss_mask, want_max=False)[0]


def prefix_role_stats(params: Any, cfg: ModelConfig, head: Array, tokens: Array, token_mask: Array,
                      loss_mask: Array) -> tuple[Array, Array, Array]:
    """:func:`role_stats` of rows that all open with ``head`` [P] and go on with
    ``tokens`` [B, T] (masks [B, T]): the head runs once, as a batch of one, and every row
    attends over its keys and values (:func:`~swarmjax.models.transformer.forward_after_head`). Values
    and gradients equal :func:`role_stats` over the rows ``[head, tokens_b]`` [B, P + T]
    when the loss covers no head id and not ``tokens[:, 0]`` (whose prediction is the
    head's last position); the forward runs P + B T positions instead of B (P + T)."""
    return _role_stats(params, cfg, tokens, token_mask, loss_mask, want_max=False, head=head)[0]


def _stats(logits: Array, tokens: Array, loss_mask: Array) -> tuple[Array, Array, Array]:
    logp = token_logprobs(logits, tokens)                                         # [B, T]
    right = jnp.pad(jnp.argmax(logits[:, :-1], -1) == tokens[:, 1:], ((0, 0), (1, 0)))
    return _masked_sums(logp, right, loss_mask)


def _masked_sums(logp: Array, right: Array, loss_mask: Array) -> tuple[Array, Array, Array]:
    """(sum of -log p, loss tokens, tokens the argmax predicted) over ``loss_mask`` [B, T]
    without t = 0 (nothing predicts it); ``logp`` and ``right`` [B, T] are position t's."""
    mask = loss_mask.at[:, 0].set(False).astype(jnp.float32)
    return -jnp.sum(logp * mask), jnp.sum(mask), jnp.sum(right * mask)


def _role_stats(params: Any, cfg: ModelConfig, tokens: Array, token_mask: Array, loss_mask: Array, *,
                want_max: bool, head: Array | None = None, mesh: Any = None, logits_chunk: int | None = 0,
                remat: str = "none") -> tuple[tuple[Array, Array, Array], Array | None]:
    """:func:`role_stats` (:func:`prefix_role_stats` after ``head`` [P] when given) and, when
    ``want_max``, the forward's attention max logits [L, N] (both passes with a head).
    ``mesh``: the hidden states' rows [B, T, D] pinned over its data axes, as the learner
    pins them (``rows_sharding``: else XLA may keep the [B, T, V] logits whole on every
    device of an fsdp or tensor axis). ``logits_chunk`` positions at a time when the rows
    are longer (:func:`~swarmjax.rl.losses.chunked_token_logprobs`: never the whole
    [B, T, V] logits; None: as many as :func:`~swarmjax.rl.losses.auto_logits_chunk`
    allows for B rows; 0: all at once). ``remat``: the layers' rematerialisation
    (:func:`~swarmjax.models.remat.remat_policy`; the rows after a ``head`` only)."""
    act = None if mesh is None else rows_sharding(mesh, (*tokens.shape, 1))
    if logits_chunk is None:
        logits_chunk = auto_logits_chunk(tokens.shape[0], cfg.vocab_size)
    chunked = bool(logits_chunk and logits_chunk < tokens.shape[1] - 1)
    kw = dict(token_mask=token_mask, return_max_logits=want_max, activation_sharding=act, return_hidden=chunked)
    out = (forward(params, cfg, tokens, remat=remat, **kw) if head is None
           else forward_after_head(params, cfg, head, tokens, **kw))
    if not chunked:
        return _stats(out.logits, tokens, loss_mask), out.max_logits
    logp, hits = chunked_token_logprobs(out.hidden, output_head(params), tokens, chunk=logits_chunk,
                                        return_hits=True)
    return _masked_sums(logp, hits, loss_mask), out.max_logits


def sft_loss(params: Any, cfg: ModelConfig, batches: Sequence[tuple[Array, Array, Array]], *,
             roles: Sequence[str] = ROLES, want_max: bool = False, heads: Sequence[Array | None] | None = None,
             mesh: Any = None, logits_chunk: int | None = 0, remat: str = "none"
             ) -> tuple[Array, tuple[dict[str, Array], Array | None]]:
    """The sum over roles of each role's mean masked NLL (the module's loss; one role: its
    mean), and (per-role metrics ``<role>_nll``, ``<role>_acc``; with ``want_max`` the
    attention max logits [L, N] over all batches, else None). ``batches``: one
    (tokens, token_mask, loss_mask) [B_r, T_r] per role of ``roles``. ``heads``: per role
    the head [P_r] its rows all open with and that its batch leaves out, or None
    (:func:`prefix_role_stats`: the same loss and gradients). ``mesh``, ``logits_chunk``,
    ``remat``: the rows pinned over the mesh's data axes, the logits chunked, the layers
    rematerialised (:func:`_role_stats`)."""
    metrics, loss, max_logits = {}, 0.0, None
    for name, batch, head in zip(roles, batches, heads or (None,) * len(roles), strict=True):
        (nll, count, right), m = _role_stats(params, cfg, *batch, want_max=want_max, head=head, mesh=mesh,
                                             logits_chunk=logits_chunk, remat=remat)
        mean = nll / jnp.maximum(count, 1.0)
        loss = loss + mean
        metrics[f"{name}_nll"], metrics[f"{name}_acc"] = mean, right / jnp.maximum(count, 1.0)
        max_logits = m if max_logits is None else jnp.maximum(max_logits, m)
    return loss, (metrics, max_logits)


def _batch(demos: Demos, idx: np.ndarray) -> tuple[Array, Array, Array]:
    return (jnp.asarray(demos.tokens[idx]), jnp.asarray(demos.token_mask[idx]),
            jnp.asarray(demos.loss_mask[idx]))


def length_buckets(demos: Demos, width: int) -> dict[int, np.ndarray]:
    """Demonstration indices grouped by length rounded up to a multiple of ``width``
    (capped at the padded length): ``{bucket length: indices}``. Batches drawn from one
    bucket are cut to its length, so short episodes are not padded to the longest
    context (one compiled step per bucket length)."""
    T = demos.tokens.shape[1]
    lengths = demos.token_mask.sum(1)
    rounded = np.minimum(-(-lengths // width) * width, T)
    return {int(L): np.flatnonzero(rounded == L) for L in np.unique(rounded)}


def sample_bucketed(buckets: dict[int, np.ndarray], batch: int, rng: np.random.Generator,
                    weights: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """``batch`` indices from one bucket. Without ``weights`` [N] the bucket is picked with
    probability proportional to its size (every demonstration equally likely overall);
    with them, P(bucket) = sum of its rows' weights and P(row | bucket) = w_row / that sum,
    so each draw picks row i with probability w_i as an ungrouped draw does. Returns
    (indices, length)."""
    lengths = sorted(buckets)
    if weights is None:
        mass = np.array([len(buckets[L]) for L in lengths], np.float64)
    else:
        mass = np.array([weights[buckets[L]].sum() for L in lengths], np.float64)
    L = lengths[rng.choice(len(lengths), p=mass / mass.sum())]
    rows = buckets[L]
    if weights is None:
        return rows[rng.integers(0, len(rows), batch)], L
    w = weights[rows].astype(np.float64)
    return rows[rng.choice(len(rows), batch, p=w / w.sum())], L


def evaluate(params: Any, cfg: ModelConfig, orch: Demos, work: Demos, batch: int = 64) -> dict[str, float]:
    """Per-role token accuracy and NLL on demonstrations (teacher-forced)."""
    stats = jax.jit(role_stats, static_argnums=1)
    out = {}
    for name, demos in (("orch", orch), ("worker", work)):
        nll = count = right = 0.0
        for i in range(0, len(demos), batch):
            idx = np.arange(i, i + batch) % len(demos)                   # fixed shape: one compile
            tokens, token_mask, loss_mask = _batch(demos, idx)
            loss_mask = loss_mask & (jnp.arange(i, i + batch) < len(demos))[:, None]   # pads count 0
            n, c, r = stats(params, cfg, tokens, token_mask, loss_mask)
            nll, count, right = nll + float(n), count + float(c), right + float(r)
        out[f"{name}_nll"], out[f"{name}_acc"] = nll / max(count, 1.0), right / max(count, 1.0)
    return out


def sft_program(cfg: ModelConfig, optim: OptimConfig, params: Any, *, roles: Sequence[str] = ROLES,
                heads: Sequence[Array | None] | None = None, mesh: Any = None, logits_chunk: int | None = None,
                remat: str = "dots") -> tuple[Any, Any, Any, Callable]:
    """The warm-start step as a program, from the params' shapes alone (``params``: arrays
    or ``jax.ShapeDtypeStruct``): (the optimizer, the params' shardings, the optimizer
    state's shardings, the jitted ``step(params, opt_state, *batches) -> (params, opt_state,
    metrics)``); the shardings are None without a mesh. What :func:`sft_step` runs and
    :func:`swarmjax.train.plan.plan_warm_start` compiles ahead of time (arguments:
    :func:`sft_step`'s)."""
    opt = make_optimizer(optim, mesh=mesh, lora=cfg.lora)
    tau = optim.qk_clip_tau
    shardings = opt_shardings = None
    jit_kw: dict[str, Any] = {}
    if mesh is not None:
        shardings = tree_shardings(param_logical_axes(cfg), params, mesh)
        opt_shardings = state_shardings_like(jax.eval_shape(opt.init, params), params, shardings, mesh)
        jit_kw["out_shardings"] = (shardings, opt_shardings, None)

    @partial(jax.jit, **jit_kw)
    def step(params, opt_state, *batches):
        grad_fn = jax.value_and_grad(partial(sft_loss, roles=roles, want_max=tau > 0, heads=heads, mesh=mesh,
                                             logits_chunk=logits_chunk, remat=remat), has_aux=True)
        (loss, (metrics, max_logits)), grads = grad_fn(params, cfg, batches)
        updates, opt_state = opt.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        metrics = {"loss": loss, **metrics}
        if tau > 0:
            params, clip = qk_clip(params, max_logits, cfg, tau=tau, alpha=optim.qk_clip_alpha)
            metrics.update(max_attn_logit=clip["max_attn_logit"], qk_clip_heads=clip["qk_clip_heads"])
        return params, opt_state, metrics
    return opt, shardings, opt_shardings, step


def sft_step(params: Any, cfg: ModelConfig, optim: OptimConfig, *, roles: Sequence[str] = ROLES,
             heads: Sequence[Array | None] | None = None, mesh: Any = None, logits_chunk: int | None = None,
             remat: str = "dots") -> tuple[Any, Any, Callable]:
    """The one warm-start step of every job: (params, optimizer state, the jitted
    ``step(params, opt_state, *batches) -> (params, opt_state, metrics)``) on
    :func:`sft_loss` over ``roles`` (one batch per role, ``heads`` passed on). Metrics:
    ``loss`` and the per-role ``<role>_nll`` / ``<role>_acc``. With ``optim.qk_clip_tau > 0``
    QK-Clip (:func:`swarmjax.optim.qk_clip`) follows every optimizer step, as in the RL
    stage: the step's attention max logits [L, N] (all roles' batches) are logged as
    ``max_attn_logit`` and heads over tau are rescaled to tau (``qk_clip_heads`` counts them).

    ``mesh``: params and optimizer state sharded as the learner shards them (the params
    returned placed so), the rows' activations pinned over the data axes; the caller
    places each batch's rows over the data axes. ``logits_chunk``: rows longer than this
    many positions get their log-probs a chunk at a time (as the learner's
    ``UpdateConfig.logits_chunk``; None, the default: as many positions as keep a chunk's
    float32 logits within :data:`~swarmjax.rl.losses.LOGITS_CHUNK_BYTES`; 0: the whole
    [B, T, V] logits). ``remat``: the layers' rematerialisation in the backward pass."""
    opt, shardings, opt_shardings, step = sft_program(cfg, optim, params, roles=roles, heads=heads, mesh=mesh,
                                                      logits_chunk=logits_chunk, remat=remat)
    if mesh is None:
        return params, opt.init(params), step
    params = global_whole(params, shardings)
    return params, jax.jit(opt.init, out_shardings=opt_shardings)(params), step


@dataclasses.dataclass(frozen=True)
class RoleRows:
    """One role's demonstrations in the warm-start loop (:func:`warm_start_loop`) and how a
    step draws its batch of ``batch`` rows [B, T] from ``demos``:

    - ``bucketed``: the rows grouped by length rounded up to a multiple of ``bucket``
      (:func:`length_buckets`), a batch from one group (:func:`sample_bucketed`, each row
      as likely as ungrouped: by ``demos.weights`` when set) cut to its length;
    - else rows drawn uniformly (or by ``demos.weights``), cut to the batch's longest row
      rounded up to a multiple of ``bucket`` (a ``bucket`` of at least the padded length:
      the whole width).

    ``head``: the ids every row opens with that the step runs once (its ``heads``); the
    batch leaves them out."""

    demos: Demos
    batch: int
    bucket: int
    bucketed: bool = False
    head: int = 0

    def sampler(self) -> Callable[[np.random.Generator], tuple[np.ndarray, ...]]:
        """``draw(rng)`` -> the next batch (tokens, token_mask, loss_mask) as host arrays."""
        d, P = self.demos, self.head
        if self.bucketed:
            buckets = length_buckets(d, self.bucket)

            def draw(rng):
                idx, L = sample_bucketed(buckets, self.batch, rng, d.weights)
                return tuple(x[idx, P:L] for x in (d.tokens, d.token_mask, d.loss_mask))
            return draw
        rounded = np.minimum(-(-d.token_mask.sum(1) // self.bucket) * self.bucket, d.tokens.shape[1])

        def draw(rng):
            idx = rng.integers(0, len(d.tokens), self.batch) if d.weights is None \
                else rng.choice(len(d.tokens), self.batch, p=d.weights)
            L = int(rounded[idx].max())
            return tuple(x[idx, P:L] for x in (d.tokens, d.token_mask, d.loss_mask))
        return draw


def warm_start_loop(params: Any, step: Callable, opt_state: Any, roles: Sequence[RoleRows], steps: int,
                    rng: np.random.Generator, on_step: Callable[[int, dict[str, float]], None] | None = None, *,
                    mesh: Any = None, extra: Callable[[int, Any], dict[str, float]] | None = None,
                    saves: Any = None) -> Any:
    """The one warm-start loop of every job: ``steps`` calls of ``step`` (:func:`sft_step`'s,
    over the roles in order), each on one batch per role drawn from ``rng`` in the roles'
    order (:meth:`RoleRows.sampler`). ``mesh``: each batch's rows placed over the data axes
    (every process draws the same rows). ``extra(i, params)``: figures added to step
    ``i``'s metrics (e.g. held-out accuracy). ``on_step(i, metrics)`` after each step.
    ``saves``: the job's :class:`~swarmjax.train.warm_steps.WarmSteps`: the loop starts
    from its newest save (params, optimizer state, ``rng``) and offers it every step
    (``saves.after``: it saves on its period and stops the loop at a preemption notice).
    Returns the params."""
    draws = [r.sampler() for r in roles]
    start = 0
    if saves is not None:
        start, params, opt_state = saves.restore(params, opt_state, rng)
    for i in range(start, steps):
        batches = [d(rng) for d in draws]
        if mesh is None:
            batches = [tuple(jnp.asarray(x) for x in b) for b in batches]
        else:
            batches = [global_whole(b, tuple(batch_sharding(mesh, 2, batch_size=len(b[0])) for _ in b))
                       for b in batches]
        params, opt_state, metrics = step(params, opt_state, *batches)
        metrics = {k: float(v) for k, v in metrics.items()}
        if extra is not None:
            metrics.update(extra(i, params))
        if on_step is not None:
            on_step(i, metrics)
        if saves is not None:
            saves.after(i + 1, params, opt_state, rng)
    return params


def train_sft(params: Any, cfg: ModelConfig, env: WideSearchConfig, scfg: SFTConfig,
              on_step: Callable[[int, dict[str, float]], None] | None = None, *,
              eval_every: int = 0, saves: Any = None) -> tuple[Any, dict[str, Any]]:
    """Warm-start ``params`` on demonstrations. Returns the trained params and a report:
    the loss history and held-out per-role accuracy before and after.

    Steps: :func:`sft_step` (QK-Clip after each with ``scfg.optim.qk_clip_tau > 0``,
    ``max_attn_logit`` and ``qk_clip_heads`` logged). ``eval_every > 0`` adds the
    held-out per-role figures (``heldout_orch_acc``, ``heldout_worker_nll``...) to the
    metrics of every ``eval_every``-th step (and to ``report["evals"]``: (step, figures)).
    ``saves``: continue from and save to a job's warm-start checkpoints
    (:func:`warm_start_loop`; ``report["history"]`` then holds the steps this call ran)."""
    train_o, train_w = make_demos(env, scfg.demos, scfg.seed, spawn_fraction=scfg.spawn_fraction,
                                  max_chunk=scfg.max_chunk)
    eval_o, eval_w = make_demos(env, scfg.eval_demos, scfg.seed + 1_000_003,
                                spawn_fraction=scfg.spawn_fraction, max_chunk=scfg.max_chunk)
    params, opt_state, step = sft_step(params, cfg, scfg.optim)
    report: dict[str, Any] = {"before": evaluate(params, cfg, eval_o, eval_w), "history": [], "evals": []}

    def held_out(i, params):
        if not (eval_every > 0 and (i + 1) % eval_every == 0):
            return {}
        held = evaluate(params, cfg, eval_o, eval_w)
        report["evals"].append((i + 1, held))
        return {f"heldout_{k}": v for k, v in held.items()}

    def logged(i, metrics):
        report["history"].append(metrics)
        if on_step is not None:
            on_step(i, metrics)
    T = train_w.tokens.shape[1]
    roles = (RoleRows(train_o, scfg.batch, scfg.bucket, bucketed=True), RoleRows(train_w, scfg.batch, T))
    params = warm_start_loop(params, step, opt_state, roles, scfg.steps, np.random.default_rng(scfg.seed), logged,
                             extra=held_out, saves=saves)
    report["after"] = evaluate(params, cfg, eval_o, eval_w)
    return params, report
