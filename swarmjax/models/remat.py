"""Rematerialisation of the layer stack in training and scoring (``forward(remat=...)``):
what each layer keeps for the backward pass.

* ``"none"`` keeps every activation;
* ``"dots"`` (the learner's and the warm start's default) keeps the outputs of the weight
  matmuls (``jax.checkpoint_policies.dots_with_no_batch_dims_saveable``) and recomputes the
  attention scores and the elementwise ops: at Qwen3-0.6B, 16 x 512 ids, the warm start's
  step plans at 20.11 GiB against 53.57 keeping everything;
* ``"block"`` keeps only each layer's input and recomputes the rest (memory ~ L x B x T x D
  instead of every intermediate; one extra forward of compute; 12.86 GiB there);
* any other name is a ready policy of ``jax.checkpoint_policies``.
"""

from __future__ import annotations

from typing import Any

import jax

REMAT_POLICIES: dict[str, Any] = {"none": None, "block": jax.checkpoint_policies.nothing_saveable,
                                  "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable}


def remat_policy(name: str) -> Any:
    """The ``jax.checkpoint`` policy named ``name`` (:data:`REMAT_POLICIES` or a
    ``jax.checkpoint_policies`` attribute); None for "none". Raises ValueError."""
    if name in REMAT_POLICIES:
        return REMAT_POLICIES[name]
    policy = getattr(jax.checkpoint_policies, name, None)
    if policy is None or name.startswith("_") or not callable(policy):
        named = sorted(n for n in dir(jax.checkpoint_policies) if not n.startswith("_"))
        raise ValueError(f"unknown remat policy {name!r}; known: {sorted(REMAT_POLICIES)} or a "
                         f"jax.checkpoint_policies name: {named}")
    if name.startswith(("save_", "offload_", "save_and_offload")) or name == "save_from_both_policies":
        raise ValueError(f"jax.checkpoint_policies.{name} builds a policy from arguments; "
                         "give a ready policy name such as 'dots_saveable'")
    return policy
