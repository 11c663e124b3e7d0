"""The learner's input: one pytree of token-in-token-out trajectories."""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

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

    def split_head(self, length: int) -> tuple[Array, "TrajectoryBatch"]:
        """(``tokens[0, :length]`` [P], the batch without its first ``length`` columns
        [B, T - P]) for a head every row shares (:func:`shared_head`): the learner runs it
        once for the whole batch (``Learner.update(head=)``)."""
        return self.tokens[0, :length], jax.tree.map(
            lambda x: x[:, length:] if x.ndim == 2 else x, self)


def shared_head(tokens, token_mask, loss_mask, *, multiple: int = 1) -> int:
    """Length P of the ids that every row of ``tokens`` [B, T] opens with and no row's
    loss covers (a system turn and tool schemas), rounded down to a multiple of
    ``multiple`` (fewer distinct shapes to compile): every row keeps at least one id
    after it, and ``loss_mask[:, P]`` is False (that id's log-prob is the head's last
    position's, which a cascade forward does not score). Host (numpy) arrays."""
    tokens, token_mask, loss_mask = (np.asarray(x) for x in (tokens, token_mask, loss_mask))
    same = np.all(tokens == tokens[:1], axis=0) & np.all(token_mask, axis=0) & ~np.any(loss_mask, axis=0)
    head = same.shape[0] if same.all() else int(np.argmin(same))
    head = min(head, int(token_mask.sum(1).min()) - 1)
    if head > 0 and loss_mask[:, head].any():    # the first id after the head is scored from the head
        head -= 1
    return max(0, head - head % max(multiple, 1))
