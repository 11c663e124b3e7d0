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


def base_parser(doc: str):
    """Flags every benchmark takes: --sizes, --batch, --repeats, --json."""
    import argparse

    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", nargs="+", default=["1m", "30m"])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", action="store_true")
    return p


def run_sizes(bench_size: Callable[[str, float], dict], sizes: list[str]) -> tuple[dict, float]:
    """Measure the peak, run ``bench_size(name, peak)`` per size, re-measure the peak
    (the machine's speed drifts on shared cores) and keep the higher one, with each
    result's ``mfu`` recomputed from its ``achieved_flops``."""
    peak = matmul_peak_flops()
    results = {name: bench_size(name, peak) for name in sizes}
    peak = max(peak, matmul_peak_flops())
    for r in results.values():
        r["peak_flops"], r["mfu"] = peak, r["achieved_flops"] / peak
    return results, peak
