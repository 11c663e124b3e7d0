"""The warm-start step at a real vocabulary: the whole [B, T, V] logits against chunks.

    python bench/sft_logits.py [--vocab 151936] [--batch 8] [--seq 512] [--hidden 64] [--layers 2]
    python bench/sft_logits.py --size qwen3-0.6b --batch 4 --repeats 1   # a preset's shape instead
    python bench/sft_logits.py --size 30m --arms chunked --remat none dots block   # what remat costs

One :func:`~swarmjax.train.sft.sft_step` (Muon, the agent role's loss over every id) of a
small model with a large vocabulary, as a tiny model over Qwen3's tokenizer is: with
``logits_chunk=0`` (the whole logits, and their float32 log-softmax and gradient, at once)
and with the default chunk (:func:`~swarmjax.rl.losses.auto_logits_chunk`: a chunk's
float32 logits within 256 MiB), in one process, each under every ``--remat`` policy
(``models.remat``; default: the warm start's own, ``TextSFTConfig.remat``).
Prints each step's best time, the compiled step's temporary bytes, and the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import matmul_peak_flops, time_best  # noqa: E402

from swarmjax.models import init_params  # noqa: E402
from swarmjax.models.config import ModelConfig, preset  # noqa: E402
from swarmjax.optim import OptimConfig  # noqa: E402
from swarmjax.rl.losses import auto_logits_chunk  # noqa: E402
from swarmjax.train.agent import TextSFTConfig  # noqa: E402
from swarmjax.train.sft import sft_step  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--size", help="a model preset (swarmjax.models.config.PRESETS) instead of --vocab/--hidden/--layers")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--arms", nargs="+", choices=("whole", "chunked"), default=["whole", "chunked"],
                   help="which steps to run (the whole logits of a large model may not fit this machine)")
    p.add_argument("--remat", nargs="+", default=[TextSFTConfig.remat],
                   help="the layers' rematerialisation: none, dots, block, or a jax.checkpoint_policies name")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    cfg = preset(args.size) if args.size else ModelConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, num_layers=args.layers, num_heads=2, num_kv_heads=1,
        head_dim=32, intermediate_size=3 * args.hidden)
    args.vocab = cfg.vocab_size
    r = np.random.RandomState(0)
    batch = (r.randint(0, args.vocab, (args.batch, args.seq)).astype(np.int32),
             np.ones((args.batch, args.seq), bool), np.ones((args.batch, args.seq), bool))
    out = {"vocab": args.vocab, "batch": args.batch, "seq": args.seq, "params": cfg.num_params(),
           "auto_chunk": auto_logits_chunk(args.batch, args.vocab), "peak_flops": matmul_peak_flops()}
    runs = [(arm if len(args.remat) == 1 else f"{arm}/{remat}", chunk, remat)
            for arm, chunk in (("whole", 0), ("chunked", None)) if arm in args.arms for remat in args.remat]
    for name, chunk, remat in runs:
        params, opt_state, step = sft_step(init_params(cfg, jax.random.key(0)), cfg, OptimConfig(), roles=("agent",),
                                           logits_chunk=chunk, remat=remat)
        compiled = step.lower(params, opt_state, batch).compile()
        out[f"{name}_temp_gib"] = compiled.memory_analysis().temp_size_in_bytes / 2 ** 30
        holder = {"state": (params, opt_state)}

        def call():
            p_, o_, m = step(*holder["state"], batch)
            holder["state"] = (p_, o_)
            jax.block_until_ready(m)
        call()
        out[f"{name}_step_s"] = time_best(call, args.repeats)
        holder.clear()                                 # the next arm's params and state in its place
        params = opt_state = None
    if len(runs) == 2 and len(args.remat) == 1:
        out["speedup"] = out["whole_step_s"] / out["chunked_step_s"]
        out["temp_ratio"] = out["chunked_temp_gib"] / out["whole_temp_gib"]
    if args.json:
        print(json.dumps(out))
        return
    print(f"jax {jax.__version__} on {jax.default_backend()} (float32 matmul peak {out['peak_flops'] / 1e9:.1f} GFLOP/s); "
          f"{out['params'] / 1e6:.1f}M params, vocabulary {args.vocab}, warm-start step of {args.batch} x {args.seq}")
    base = out[f"{runs[0][0]}_step_s"]
    print(f"{'':16}{'step s':>9}{'temp GiB':>10}{'x ' + runs[0][0]:>18}")
    for name, _, _ in runs:
        print(f"{name:16}{out[name + '_step_s']:9.3f}{out[name + '_temp_gib']:10.2f}{out[name + '_step_s'] / base:18.2f}")
    if "speedup" in out:
        print(f"chunked ({out['auto_chunk']} positions a chunk): {out['speedup']:.2f}x faster, "
              f"{out['temp_ratio']:.2f}x the temporary memory")


if __name__ == "__main__":
    main()
