"""The warm-start gradient with the SwiGLU's own backward pass (``swarmjax.models.dense``)
against the autodiff of plain ``x @ w``, in one process.

    python bench/mlp_backward.py [--config configs/context_widesearch.py] [--rows 16] [--seq 768]

The config's model (its vocabulary as the tokenizer it trains would have it), one
warm-start loss (:func:`swarmjax.train.sft.sft_loss`) on random ids; the gradient timed
with the MLP's projections as :func:`swarmjax.models.dense.dense` (custom VJP) and
as ``x @ w`` (baseline), each after a compile, median of ``--repeats``. Prints seconds a
gradient for both, ``speedup`` = baseline / dense, the largest difference of the two
gradients, and the machine's matmul peak.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=os.path.join(ROOT, "configs", "context_widesearch.py"))
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--seq", type=int, default=768)
    p.add_argument("--vocab", type=int, default=1024, help="the model's vocabulary (the config's tokenizer_vocab)")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()

    import jax
    import jax.numpy as jnp
    import numpy as np

    from common import matmul_peak_flops
    from swarmjax.config_file import load_config
    from swarmjax.models import transformer
    from swarmjax.models.transformer import init_params
    from swarmjax.train.agent_job import AgentJob
    from swarmjax.train.sft import sft_loss

    job = load_config(args.config, AgentJob)
    cfg = dataclasses.replace(job.model, vocab_size=args.vocab)
    params = init_params(cfg, jax.random.key(0))
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, args.vocab, (args.rows, args.seq)), jnp.int32)
    batch = (tokens, jnp.ones(tokens.shape, bool), jnp.ones(tokens.shape, jnp.float32))
    loss = lambda p: sft_loss(p, cfg, [batch], roles=("agent",))[0]        # noqa: E731

    def timed() -> tuple[float, object]:
        grad = jax.jit(jax.grad(loss))                 # traced now: with whichever dense is in place
        out = jax.block_until_ready(grad(params))
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            jax.block_until_ready(grad(params))
            times.append(time.perf_counter() - t0)
        return statistics.median(times), out

    own = transformer.dense
    t_dense, g_dense = timed()
    transformer.dense = lambda x, w: x @ w              # the baseline: autodiff of the plain matmul
    jax.clear_caches()                                  # trace again, with it
    try:
        t_plain, g_plain = timed()
    finally:
        transformer.dense = own
    diff = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(g_dense), jax.tree.leaves(g_plain)))
    print(json.dumps({"config": os.path.relpath(args.config, ROOT), "rows": args.rows, "seq": args.seq,
                      "plain_s": round(t_plain, 3), "dense_s": round(t_dense, 3),
                      "speedup": round(t_plain / t_dense, 2), "max_grad_diff": diff,
                      "matmul_peak_gflops": round(matmul_peak_flops() / 1e9, 1)}))


if __name__ == "__main__":
    main()
