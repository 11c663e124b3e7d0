"""Shared benchmark helpers: the machine's measured matmul peak and best-of-N timing."""

from __future__ import annotations

import time
from collections.abc import Callable

import jax
import jax.numpy as jnp


def time_best(fn: Callable[[], object], repeats: int) -> float:
    """Best wall-clock seconds of ``repeats`` calls of ``fn`` (which must block)."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def matmul_peak_flops(n: int = 2048, repeats: int = 10, dtype=jnp.float32) -> float:
    """Achieved FLOP/s of a jitted ``n x n @ n x n`` matmul on the default device:
    the practical peak the benchmarks' MFU figures are measured against."""
    a = jax.random.normal(jax.random.key(0), (n, n), dtype)
    b = jax.random.normal(jax.random.key(1), (n, n), dtype)
    mm = jax.jit(lambda x, y: x @ y)
    jax.block_until_ready(mm(a, b))
    return 2 * n ** 3 / time_best(lambda: jax.block_until_ready(mm(a, b)), repeats)
