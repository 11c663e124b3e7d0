"""The learner's input: one pytree of token-in-token-out trajectories."""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

Array = jax.Array


@flax.struct.dataclass
class TrajectoryBatch:
    """What the learner consumes, exactly as the rollout produced it (never re-tokenised).

    tokens:           [B, T] int32  prompt + every generated / environment token.
    token_mask:       [B, T] bool   real tokens (False on padding; never attended to).
    loss_mask:        [B, T] bool   True only on tokens the trained policy sampled
                                    (environment and sub-agent tokens are observations).
    sampler_logprobs: [B, T] f32    the sampler's log-prob of each token (0 off the loss mask).
    advantages:       [B] f32       per-trajectory advantage (see :mod:`swarmjax.rl.advantages`).
    group_ids:        [B] int32     prompt group of each row (G rows per prompt).
    rewards:          [B] f32       scalar reward per row (for metrics; advantages drive the loss).

    Token ``t`` is predicted from tokens ``< t``, so ``loss_mask[:, 0]`` must be False.
    """

    tokens: Array
    token_mask: Array
    loss_mask: Array
    sampler_logprobs: Array
    advantages: Array
    group_ids: Array
    rewards: Array

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    @classmethod
    def create(cls, tokens, loss_mask, advantages, *, token_mask=None, sampler_logprobs=None,
               group_ids=None, rewards=None) -> "TrajectoryBatch":
        """Fill optional fields with neutral defaults (all real tokens, zero log-probs,
        one group per row, zero rewards)."""
        tokens = jnp.asarray(tokens, jnp.int32)
        B, T = tokens.shape
        rows = jnp.arange(B, dtype=jnp.int32)
        return cls(
            tokens=tokens,
            token_mask=jnp.ones((B, T), bool) if token_mask is None else jnp.asarray(token_mask, bool),
            loss_mask=jnp.asarray(loss_mask, bool).at[:, 0].set(False),
            sampler_logprobs=(jnp.zeros((B, T), jnp.float32) if sampler_logprobs is None
                              else jnp.asarray(sampler_logprobs, jnp.float32)),
            advantages=jnp.asarray(advantages, jnp.float32),
            group_ids=rows if group_ids is None else jnp.asarray(group_ids, jnp.int32),
            rewards=jnp.zeros((B,), jnp.float32) if rewards is None else jnp.asarray(rewards, jnp.float32),
        )
