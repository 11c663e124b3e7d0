"""Mixture-of-experts MLP benchmark: its cost against a dense SwiGLU of the same active
FLOPs, and expert parallelism against experts gathered by XLA.

    python bench/moe.py                      # one device: MoE / dense step time
    python bench/moe.py --mesh 1,8,1         # plus expert parallel vs gathered on 8 devices
    python bench/moe.py --json

One forward + backward of the MLP alone (the sum of its outputs as the loss) on ``--tokens``
tokens of width ``--hidden``, with ``--experts`` experts of ``--expert-width``, ``--k`` a
token (float32). The baseline, measured in the same run, is a dense SwiGLU of width
``k x expert-width``: the same matmul FLOPs a token (``6 x 3 x D x k F``, forward and
backward). ``moe_over_dense`` is the MoE's step time over the dense one's; MFU is against
the float32 matmul peak measured in the same run (before and after, the higher kept).
XLA:CPU expands ``ragged_dot`` into a dense product over every expert, so on a CPU the
MoE does about E / k times the dense work.

``--mesh D,F,T`` (on a CPU, simulated devices: the script asks for as many) times the
same step with the experts split over the ``experts`` rule's axes, once dispatched by
all-to-all (:func:`swarmjax.models.moe.moe_expert_parallel`) and once left to XLA
(:func:`swarmjax.models.moe.moe_local` on the sharded weights: XLA gathers the experts),
and reports each compiled program's temporaries per device. Simulated devices share the
machine's cores, so the times there show the extra work, not a pod's communication.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from devices import ask_for_devices, mesh_shape  # noqa: E402

ask_for_devices()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec  # noqa: E402

from common import matmul_peak_flops, time_best  # noqa: E402

from swarmjax.models.config import ModelConfig  # noqa: E402
from swarmjax.models.moe import EXPERT_AXES, moe_expert_parallel, moe_local  # noqa: E402
from swarmjax.sharding.mesh import MeshConfig, logical_sharding, make_mesh  # noqa: E402


def _params(cfg: ModelConfig, key) -> dict:
    D, E, F = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size
    keys = jax.random.split(key, 4)
    shapes = {"router": (D, E), "expert_gate": (E, D, F), "expert_up": (E, D, F), "expert_down": (E, F, D)}
    return {n: jax.random.normal(k, s, jnp.float32) * 0.05 for (n, s), k in zip(shapes.items(), keys)}


def _dense(x, p):
    return (jax.nn.silu(x @ p["gate"]) * (x @ p["up"])) @ p["down"]


def _timed(loss, params, x, repeats):
    step = jax.jit(jax.grad(loss, argnums=(0, 1)))         # weights and input: 3 x the forward matmuls
    compiled = step.lower(params, x).compile()
    jax.block_until_ready(step(params, x))
    seconds = time_best(lambda: jax.block_until_ready(step(params, x)), repeats)
    return seconds, compiled.memory_analysis().temp_size_in_bytes


def main() -> None:
    import argparse

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--experts", type=int, default=16)
    p.add_argument("--k", type=int, default=2)
    p.add_argument("--expert-width", type=int, default=512)
    p.add_argument("--mesh", help="D,F,T: also expert parallel vs gathered on this mesh")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    cfg = ModelConfig(hidden_size=args.hidden, num_experts=args.experts, experts_per_token=args.k,
                      moe_intermediate_size=args.expert_width)
    N, D, F = args.tokens, args.hidden, args.k * args.expert_width
    x = jax.random.normal(jax.random.key(0), (N, D), jnp.float32)
    moe = _params(cfg, jax.random.key(1))
    dense = {n: jax.random.normal(jax.random.key(i), s, jnp.float32) * 0.05
             for i, (n, s) in enumerate((("gate", (D, F)), ("up", (D, F)), ("down", (F, D))))}
    peak = matmul_peak_flops()
    flops = 6 * 3 * N * D * F                                         # forward + backward, active weights
    dense_s, _ = _timed(lambda p, x: _dense(x, p).sum(), dense, x, args.repeats)
    moe_s, _ = _timed(lambda p, x: moe_local(x, p, cfg).sum(), moe, x, args.repeats)
    peak = max(peak, matmul_peak_flops())              # again: the shared cores' speed drifts
    r = {"backend": jax.default_backend(), "tokens": N, "hidden": D, "experts": args.experts, "k": args.k,
         "expert_width": args.expert_width, "peak_flops": peak, "dense_s": dense_s, "moe_s": moe_s,
         "moe_over_dense": moe_s / dense_s, "dense_mfu": flops / dense_s / peak, "moe_mfu": flops / moe_s / peak}
    if args.mesh:
        mesh = make_mesh(MeshConfig(*mesh_shape(args.mesh)))
        placed = {n: jax.device_put(a, logical_sharding(EXPERT_AXES.get(n, ("embed", None)), a.shape, mesh))
                  for n, a in moe.items()}
        tokens = NamedSharding(mesh, PartitionSpec(None, ("data", "fsdp")))
        xs = jax.device_put(x[None], tokens)                          # [1, N, D]: tokens over data x fsdp
        parallel_s, parallel_temp = _timed(lambda p, x: moe_expert_parallel(x, p, cfg, tokens).sum(),
                                           placed, xs, args.repeats)
        gathered_s, gathered_temp = _timed(lambda p, x: moe_local(x[0], p, cfg).sum(), placed, xs, args.repeats)
        r.update(mesh=dict(mesh.shape), parallel_s=parallel_s, gathered_s=gathered_s,
                 parallel_temp_mib=parallel_temp / 2 ** 20, gathered_temp_mib=gathered_temp / 2 ** 20,
                 parallel_over_gathered=parallel_s / gathered_s)
    if args.json:
        print(json.dumps(r))
        return
    print(f"{N} tokens x {D}, {args.experts} experts of {args.expert_width}, {args.k} a token "
          f"({r['backend']}, float32 matmul peak {peak / 1e9:.1f} GFLOP/s); forward + backward:")
    print(f"  dense SwiGLU of {F}: {dense_s * 1e3:8.1f} ms  MFU {r['dense_mfu']:.2f}")
    print(f"  mixture of experts : {moe_s * 1e3:8.1f} ms  MFU {r['moe_mfu']:.2f}   moe / dense {r['moe_over_dense']:.2f}")
    if args.mesh:
        print(f"  on mesh {r['mesh']}: expert parallel {parallel_s * 1e3:.1f} ms, {r['parallel_temp_mib']:.1f} MiB "
              f"temporaries a device; gathered by XLA {gathered_s * 1e3:.1f} ms, {r['gathered_temp_mib']:.1f} MiB "
              f"(parallel / gathered {r['parallel_over_gathered']:.2f})")


if __name__ == "__main__":
    main()
