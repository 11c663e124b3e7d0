"""Warm-start batches of mixed lengths against batches of one length bucket (``sft.by_length``).

    python bench/warm_start_batches.py [--config configs/context_widesearch.py] [--steps 30] [--demos 256]

The config's own demonstrations (its task, ways of working and row shares), played through
its environments; then the same compiled warm-start step timed on ``--steps`` batches drawn
each way, after a step at every length a batch can have (so no compile is timed):

* mixed: rows drawn by their share, cut to the batch's longest row (a multiple of
  ``sft.bucket``);
* by length: the bucket drawn by its rows' shares, then its rows (each row as likely).

Prints ids a step (padding included) and seconds a step for each, and ``speedup`` = mixed /
by-length seconds a step, both measured in this process, with the matmul peak.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=os.path.join(ROOT, "configs", "context_widesearch.py"))
    p.add_argument("--steps", type=int, default=30, help="timed steps each way")
    p.add_argument("--demos", type=int, default=256, help="demonstrations played (each gives several rows)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()

    import jax
    import jax.numpy as jnp
    import numpy as np

    from common import matmul_peak_flops
    from swarmjax.config_file import apply_overrides, load_config
    from swarmjax.models.transformer import init_params
    from swarmjax.train.agent_job import AgentJob, AgentRun, warm_start_demos
    from swarmjax.train.sft import RoleRows, length_buckets, sft_step

    job = apply_overrides(load_config(args.config, AgentJob), [f"sft.demos={args.demos}"])
    scfg = job.sft
    if scfg.per_role:
        raise SystemExit(f"{args.config}: sft.per_role draws its rows by role, not by length")
    run = AgentRun(job, tempfile.mkdtemp(prefix="swarmjax-bench-"), progress=False)
    try:
        data = warm_start_demos(run)                 # the job's own warm-start rows
    finally:
        run.close()
    buckets = length_buckets(data, scfg.bucket)
    params, opt, step = sft_step(init_params(run.cfg, run.key), run.cfg, scfg.optim, roles=("agent",))
    peak = matmul_peak_flops()
    out = {"config": os.path.relpath(args.config, ROOT), "rows": len(data), "batch": scfg.batch,
           "bucket_rows": {str(k): int(len(v)) for k, v in buckets.items()}, "peak_flops": peak}
    for name, by in (("mixed", False), ("by_length", True)):
        draw, rng, seen = RoleRows(data, scfg.batch, scfg.bucket, bucketed=by).sampler(), np.random.default_rng(1), set()
        lengths = set(buckets) if by else {min(-(-int(data.token_mask.sum(1).max()) // scfg.bucket) * scfg.bucket,
                                               data.tokens.shape[1])}
        for _ in range(2000):                     # compile every length this way draws (mixed: nearly always the widest)
            b = draw(rng)
            if b[0].shape[1] not in seen:
                seen.add(b[0].shape[1])
                params, opt, m = step(params, opt, tuple(map(jnp.asarray, b)))
                jax.block_until_ready(m)
            if lengths <= seen:
                break
        ids, t0 = 0, time.perf_counter()
        for _ in range(args.steps):
            b = draw(rng)
            ids += b[0].size
            params, opt, m = step(params, opt, tuple(map(jnp.asarray, b)))
        jax.block_until_ready(m)
        out[name] = {"ids_per_step": ids / args.steps, "s_per_step": (time.perf_counter() - t0) / args.steps}
    out["speedup"] = out["mixed"]["s_per_step"] / out["by_length"]["s_per_step"]
    if args.json:
        print(json.dumps(out))
        return
    print(f"{out['config']}: {out['rows']} rows, batches of {out['batch']}; matmul peak {peak / 1e9:.0f} GFLOP/s")
    for name in ("mixed", "by_length"):
        r = out[name]
        print(f"  {name:10s} {r['ids_per_step']:9.0f} ids a step  {r['s_per_step']:7.3f} s a step")
    print(f"  speedup (mixed / by length): {out['speedup']:.2f}x")


if __name__ == "__main__":
    main()
