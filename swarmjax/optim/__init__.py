"""Optimizers: Muon + AdamW on optax, and QK-Clip (MuonClip)."""

from swarmjax.optim.muon import (OPTIMIZERS, OptimConfig, learning_rate_schedule, make_optimizer,
                                 muon_dimension_numbers)
from swarmjax.optim.qk_clip import clip_factors, qk_clip

__all__ = ["OPTIMIZERS", "OptimConfig", "learning_rate_schedule", "make_optimizer",
           "muon_dimension_numbers", "clip_factors", "qk_clip"]
