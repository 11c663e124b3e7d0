"""Learner-step benchmark: tokens/s, MFU, and the cost of Muon over AdamW.

    python bench/update.py            # table
    python bench/update.py --json     # one JSON object

For each model size (presets ``1m`` and ``30m``) one ``Learner.update`` with one
minibatch and one microbatch is timed on a batch of ``--batch`` x ``--seq``
tokens, all of them in the loss. The step runs a forward pass for the old
log-probs, then forward + backward + optimizer, so the FLOPs it performs are
4 x the forward FLOPs, with forward FLOPs per token =
``2 x matmul weights + 4 x L x H x hd x T`` (attention over the full T, as
executed). MFU = achieved FLOP/s / the float32 matmul peak measured in the same
run (a jitted 2048 x 2048 matmul). Muon / AdamW is the step-time ratio of the
same step with the two optimizers (QK-Clip off in both, so it is the cost of
Newton-Schulz); the Muon + QK-Clip time is reported too. Newton-Schulz costs a
fixed time per optimizer step (``ns_overhead_s``) whatever the batch, so the
ratio depends on tokens per step: the default 32 x 256 = 8192 tokens is a
modest RL minibatch; ``--batch 16 --seq 128`` shows the small-batch end.

``--head P``: every row opens with the same P ids (a system turn and tool schemas)
and none of them is in the loss; the same update (Muon) is timed on the whole rows
and with the head given once (``Learner.update(head=)``, cascade attention), and
``head_speedup`` = whole / head step seconds. The text PARL job's batches look like
``--sizes 1m --batch 32 --seq 1280 --head 512``.

``--attention-blocks``: the same update (Muon) with the causal self-attention of long rows
by query blocks (the default, ``models.attention.ATTENTION_BLOCK``) and with one softmax
over whole rows; ``blocks_speedup`` = whole / blocked step seconds (the text jobs' warm
starts look like ``--sizes 1m --batch 16 --seq 1280``).

``--tokens-sweep N ...``: Muon / AdamW at each of these tokens per step too (``--seq`` ids a
row, N / seq rows, QK-Clip off), the first size only: Newton-Schulz costs a fixed time per
optimizer step, so its share should fall as the tokens grow (``sweep``: tokens, both step
times, the ratio).

``--mesh D,F,T``: the same steps on a (data, fsdp, tensor) mesh (on a CPU, simulated
devices: the script asks for as many), params sharded by the logical rules, plus Muon
left to XLA (``muon_gathered``: the optimizer not given the mesh, so Newton-Schulz
gathers every layer's matrices on every device) against Muon spread over the mesh
(:func:`swarmjax.optim.muon.newton_schulz`): ``spread_over_gathered`` is their
step-time ratio.
"""

from __future__ import annotations

import json
import os
import sys
import time


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from devices import ask_for_devices, mesh_shape  # noqa: E402

ask_for_devices()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from common import base_parser, run_sizes, time_best  # noqa: E402

from swarmjax.models.config import preset  # noqa: E402
from swarmjax.models.transformer import init_params  # noqa: E402
from swarmjax.optim.muon import OptimConfig, make_optimizer  # noqa: E402
from swarmjax.rl.trajectory import TrajectoryBatch, shared_head  # noqa: E402
from swarmjax.rl.update import Learner, UpdateConfig  # noqa: E402
from swarmjax.sharding.mesh import MeshConfig, make_mesh  # noqa: E402


def make_batch(cfg, batch: int, seq: int, seed: int = 0) -> TrajectoryBatch:
    r = np.random.RandomState(seed)
    tokens = r.randint(0, cfg.vocab_size, (batch, seq))
    loss_mask = np.ones((batch, seq), bool)
    adv = r.randn(batch).astype(np.float32)
    return TrajectoryBatch.create(tokens, loss_mask, adv, sampler_logprobs=np.zeros((batch, seq)))


def time_update(cfg, optim: OptimConfig, batch: TrajectoryBatch, repeats: int, head=None, *, mesh=None,
                gathered: bool = False) -> tuple[float, float]:
    """(compile + first step seconds, best steady step seconds); ``gathered``: Muon not
    told the mesh (XLA gathers each layer's matrices for Newton-Schulz)."""
    learner = Learner(cfg, UpdateConfig(optim=optim, num_minibatches=1, num_microbatches=1), mesh=mesh,
                      optimizer=make_optimizer(optim) if gathered else None)
    state = learner.init(init_params(cfg, jax.random.key(0)))
    t0 = time.perf_counter()
    state, metrics = jax.block_until_ready(learner.update(state, batch, head=head))
    first = time.perf_counter() - t0
    holder = {"state": state}

    def step():
        holder["state"], m = learner.update(holder["state"], batch, head=head)
        jax.block_until_ready(m)
    return first, time_best(step, repeats)


def bench_head(cfg, args) -> dict:
    """The update on rows sharing a head of ``args.head`` ids: whole rows vs ``head=``."""
    whole = make_batch(cfg, args.batch, args.seq)
    tokens = np.asarray(whole.tokens).copy()
    tokens[:, :args.head] = tokens[0, :args.head]
    loss_mask = np.arange(args.seq)[None, :] > args.head
    whole = whole.replace(tokens=jnp.asarray(tokens), loss_mask=jnp.asarray(np.broadcast_to(loss_mask, tokens.shape)))
    P = shared_head(whole.tokens, whole.token_mask, whole.loss_mask, multiple=64)
    head, rest = whole.split_head(P)
    optim = OptimConfig(name="muon", qk_clip_tau=0.0)
    _, whole_s = time_update(cfg, optim, whole, args.repeats)
    _, head_s = time_update(cfg, optim, rest, args.repeats, head=head)
    return {"head": P, "whole_step_s": whole_s, "head_step_s": head_s, "head_speedup": whole_s / head_s}


def bench_blocks(cfg, batch: TrajectoryBatch, repeats: int) -> dict:
    """The update with attention by query blocks (default) and over whole rows."""
    from swarmjax.models import attention

    optim = OptimConfig(name="muon", qk_clip_tau=0.0)
    _, blocked_s = time_update(cfg, optim, batch, repeats)
    block, attention.ATTENTION_BLOCK = attention.ATTENTION_BLOCK, 1 << 30    # one block: whole rows
    try:
        _, whole_s = time_update(cfg, optim, batch, repeats)
    finally:
        attention.ATTENTION_BLOCK = block
    return {"attention_block": block, "blocked_step_s": blocked_s, "whole_attention_step_s": whole_s,
            "blocks_speedup": whole_s / blocked_s}


def bench_size(name: str, args, peak: float) -> dict:
    cfg = preset(name)
    if args.dtype:
        cfg = cfg.replace(param_dtype=args.dtype, dtype=args.dtype)
    batch = make_batch(cfg, args.batch, args.seq)
    tokens = args.batch * args.seq
    flops = 4 * cfg.matmul_flops_per_token(context=args.seq) * tokens
    mesh = args.mesh and make_mesh(MeshConfig(*args.mesh))
    muon = OptimConfig(name="muon", qk_clip_tau=0.0)
    compile_s, muon_s = time_update(cfg, muon, batch, args.repeats, mesh=mesh)
    _, adamw_s = time_update(cfg, OptimConfig(name="adamw", qk_clip_tau=0.0), batch, args.repeats, mesh=mesh)
    _, clip_s = time_update(cfg, OptimConfig(name="muon", qk_clip_tau=100.0), batch, args.repeats, mesh=mesh)
    out = bench_head(cfg, args) if args.head else {}
    if args.tokens_sweep and name == args.sizes[0]:
        out["sweep"] = []
        for n in args.tokens_sweep:
            rows = make_batch(cfg, max(1, n // args.seq), args.seq)
            _, m = time_update(cfg, muon, rows, args.repeats, mesh=mesh)
            _, a = time_update(cfg, OptimConfig(name="adamw", qk_clip_tau=0.0), rows, args.repeats, mesh=mesh)
            out["sweep"].append({"tokens": int(rows.tokens.size), "muon_step_s": m, "adamw_step_s": a,
                                 "muon_over_adamw": m / a})
    if args.attention_blocks:
        out.update(bench_blocks(cfg, batch, args.repeats))
    if mesh:
        _, gathered_s = time_update(cfg, muon, batch, args.repeats, mesh=mesh, gathered=True)
        out.update(mesh=list(args.mesh), muon_gathered_step_s=gathered_s, spread_over_gathered=muon_s / gathered_s)
    return {
        **out, "params": cfg.num_params(), "tokens_per_step": tokens, "compile_s": compile_s,
        "step_s": muon_s, "tok_s": tokens / muon_s, "achieved_flops": flops / muon_s,
        "peak_flops": peak, "mfu": flops / muon_s / peak,
        "adamw_step_s": adamw_s, "muon_qkclip_step_s": clip_s,
        "muon_over_adamw": muon_s / adamw_s, "qkclip_over_muon": clip_s / muon_s,
        # Newton-Schulz seconds per step: fixed per step, so the ratio falls with batch size
        "ns_overhead_s": muon_s - adamw_s,
    }


def main() -> None:
    p = base_parser(__doc__)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--head", type=int, default=0, help="also time rows sharing this many leading ids")
    p.add_argument("--tokens-sweep", type=int, nargs="+", default=(),
                   help="also Muon / AdamW at these tokens per step (the first size)")
    p.add_argument("--attention-blocks", action="store_true",
                   help="also time the update with attention over whole rows instead of by query blocks")
    p.add_argument("--mesh", type=mesh_shape, default=None,
                   help="data,fsdp,tensor: time the steps on this mesh (and Muon left to XLA beside it)")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16"],
                   help="params and matmuls of every size, and the peak's matmul (default: each preset's "
                        "own dtype, float32 peak)")
    args = p.parse_args()
    results, peak = run_sizes(lambda name, peak: bench_size(name, args, peak), args.sizes,
                              dtype=args.dtype or "float32")
    if args.json:
        print(json.dumps(results))
        return
    print(f"jax {jax.__version__} on {jax.devices()[0].platform} x{len(jax.devices())}"
          f"{f', mesh {args.mesh}' if args.mesh else ''}, "
          f"batch {args.batch} x {args.seq} tokens, {args.dtype or 'float32'} matmul peak {peak / 1e9:.1f} GFLOP/s")
    head = f"{'size':>5} {'params':>8} {'compile s':>9} {'step s':>8} {'tok/s':>9} {'GFLOP/s':>8} " \
           f"{'MFU':>6} {'adamw s':>8} {'NS s':>6} {'muon/adamw':>10} {'+qkclip':>8}"
    print(head)
    for name, r in results.items():
        print(f"{name:>5} {r['params'] / 1e6:>7.2f}M {r['compile_s']:>9.2f} {r['step_s']:>8.3f} "
              f"{r['tok_s']:>9.0f} {r['achieved_flops'] / 1e9:>8.1f} {r['mfu']:>6.1%} "
              f"{r['adamw_step_s']:>8.3f} {r['ns_overhead_s']:>6.2f} {r['muon_over_adamw']:>10.3f} "
              f"{r['qkclip_over_muon']:>8.3f}")
    for name, r in results.items():
        for row in r.get("sweep", ()):
            print(f"{name}: {row['tokens']:>7} tokens a step: Muon {row['muon_step_s']:.3f} s, AdamW "
                  f"{row['adamw_step_s']:.3f} s, Muon / AdamW {row['muon_over_adamw']:.3f}")
        if "mesh" in r:
            print(f"{name}: Muon on mesh {tuple(r['mesh'])}: spread {r['step_s']:.3f} s, gathered by XLA "
                  f"{r['muon_gathered_step_s']:.3f} s, spread/gathered {r['spread_over_gathered']:.3f}, "
                  f"muon/adamw {r['muon_over_adamw']:.3f}")
        if "blocks_speedup" in r:
            print(f"{name}: attention by blocks of {r['attention_block']} queries {r['blocked_step_s']:.3f} s, "
                  f"over whole rows {r['whole_attention_step_s']:.3f} s, speedup {r['blocks_speedup']:.2f}x")
        if "head" in r:
            print(f"{name}: rows sharing {r['head']} leading ids: whole {r['whole_step_s']:.3f} s, "
                  f"head= {r['head_step_s']:.3f} s, speedup {r['head_speedup']:.2f}x")


if __name__ == "__main__":
    main()
