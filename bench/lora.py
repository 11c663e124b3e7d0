"""LoRA against full training, and rows of several adapters in one decode.

    python bench/lora.py                                  # presets 30m and qwen3-0.6b
    python bench/lora.py --sizes 30m --batch 8 --seq 128  # a quick look
    python bench/lora.py --json

Per model size, in one process:

1. **Update.** One ``Learner.update`` (one minibatch, AdamW for both: the optimizer LoRA
   uses by default) on ``--batch`` x ``--seq`` tokens, full fine-tuning against LoRA of
   rank ``--rank`` on every linear map: best-of-``--repeats`` seconds, and the compiled
   update's memory (XLA's analysis: arguments + outputs - aliased + temporaries, i.e. the
   params, their optimizer state and the step's temporaries). ``update_speedup`` = full /
   LoRA seconds, ``update_memory_ratio`` = LoRA / full bytes.
2. **Decode.** ``--rows`` rows, ``--prompt`` ids of prompt, ``--new`` ids each: an
   orchestrator's rows and its sub-agents' rows, half and half, as a LoRA swarm decodes
   them (two adapters over one base, each row picking its own: ``Sampler(adapter=)``)
   against what a job without LoRA does (two merged models, each decoding its half:
   two passes over two weight sets) and against one merged model decoding every row
   (the floor: one weight set, no adapters). ``decode_vs_two_models`` = two merged
   models' seconds / the batched adapters' seconds; ``adapter_overhead`` = the batched
   adapters' seconds / the one merged model's.

Seconds are this machine's; compare only the ratios of one run. The float32 matmul peak
is printed beside them (``bench/common.matmul_peak_flops``).
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from common import base_parser, matmul_peak_flops, time_best  # noqa: E402
from update import make_batch  # noqa: E402

from swarmjax.models.config import LoraConfig, preset  # noqa: E402
from swarmjax.models.lora import init_lora, merge  # noqa: E402
from swarmjax.models.transformer import init_params  # noqa: E402
from swarmjax.optim.muon import OptimConfig  # noqa: E402
from swarmjax.rl.update import Learner, UpdateConfig  # noqa: E402
from swarmjax.sampling import Sampler, SamplingConfig  # noqa: E402


def time_update(cfg, batch, repeats: int) -> tuple[float, int]:
    """(best step seconds, compiled update bytes) of one AdamW update of ``cfg``."""
    learner = Learner(cfg, UpdateConfig(optim=OptimConfig(name="adamw", qk_clip_tau=0.0), num_minibatches=1))
    state = learner.init(init_params(cfg, jax.random.key(0)))
    state, m = jax.block_until_ready(learner.update(state, batch))           # compile
    m = learner._update[(len(batch.tokens), None)].lower(state, batch, None).compile().memory_analysis()
    memory = m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes
    holder = {"state": state}

    def step():
        holder["state"], out = learner.update(holder["state"], batch)
        jax.block_until_ready(out)
    return time_best(step, repeats), memory


def trained(params, cfg, adapters: int):
    """``params`` with ``adapters`` adapters whose B is not zero (fresh ones add nothing)."""
    lora = init_lora(cfg, jax.random.key(1), adapters=adapters)
    noise = lambda p, x: x if p[-1].key.endswith("_clip") else x + 0.01 * jax.random.normal(
        jax.random.key(x.size), x.shape, x.dtype)
    return {**params, "lora": jax.tree_util.tree_map_with_path(noise, lora)}


def bench_decode(base, cfg, args) -> dict:
    """Seconds of the three decodes (module docstring)."""
    rows, half = args.rows, args.rows // 2
    prompts = np.random.RandomState(0).randint(1, cfg.vocab_size, (rows, args.prompt))
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=args.new)
    lcfg = cfg.replace(lora=LoraConfig(rank=args.rank))
    params = trained(base, lcfg, 2)
    merged = [merge(params, lcfg, index=i) for i in range(2)]
    adapter = np.repeat(np.arange(2), [half, rows - half])
    batched, plain = Sampler(lcfg, sampling), Sampler(cfg, sampling)

    def run(sampler, p, x, **kw):
        return lambda: jax.block_until_ready(sampler(p, x, key=jax.random.key(0), **kw).tokens)
    calls = {"batched_adapters": [run(batched, params, prompts, adapter=adapter)],
             "two_merged_models": [run(plain, merged[0], prompts[:half]), run(plain, merged[1], prompts[half:])],
             "one_merged_model": [run(plain, merged[0], prompts)]}
    out = {}
    for name, fns in calls.items():
        for fn in fns:
            fn()                                                            # compile
        out[f"{name}_s"] = time_best(lambda fns=fns: [fn() for fn in fns], args.repeats)
    out["decode_vs_two_models"] = out["two_merged_models_s"] / out["batched_adapters_s"]
    out["adapter_overhead"] = out["batched_adapters_s"] / out["one_merged_model_s"]
    return out


def bench_size(name: str, args) -> dict:
    cfg = preset(name)
    batch = make_batch(cfg, args.batch, args.seq)
    full_s, full_bytes = time_update(cfg, batch, args.repeats)
    lora_s, lora_bytes = time_update(cfg.replace(lora=LoraConfig(rank=args.rank)), batch, args.repeats)
    out = {"params": cfg.num_params(), "rank": args.rank, "tokens_per_step": args.batch * args.seq,
           "full_step_s": full_s, "lora_step_s": lora_s, "update_speedup": full_s / lora_s,
           "full_update_bytes": full_bytes, "lora_update_bytes": lora_bytes,
           "update_memory_ratio": lora_bytes / full_bytes}
    return {**out, **bench_decode(init_params(cfg, jax.random.key(0)), cfg, args)}


def main() -> None:
    p = base_parser(__doc__)
    p.set_defaults(sizes=["30m", "qwen3-0.6b"], batch=4, repeats=2)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--rows", type=int, default=16, help="decode rows (half each adapter)")
    p.add_argument("--prompt", type=int, default=64)
    p.add_argument("--new", type=int, default=32)
    args = p.parse_args()
    peak = matmul_peak_flops()
    results = {name: bench_size(name, args) for name in args.sizes}
    if args.json:
        print(json.dumps({"peak_flops": peak, "sizes": results}))
        return
    print(f"float32 matmul peak {peak / 1e9:.0f} GFLOP/s; update {args.batch} x {args.seq} tokens (AdamW), "
          f"LoRA rank {args.rank} on every linear map; decode {args.rows} rows, {args.prompt} + {args.new} ids")
    print(f"{'size':<12}{'full s':>9}{'LoRA s':>9}{'speedup':>9}{'full GiB':>10}{'LoRA GiB':>10}{'mem ratio':>10}"
          f"{'2 models s':>12}{'adapters s':>12}{'vs 2 models':>12}{'overhead':>10}")
    for name, r in results.items():
        print(f"{name:<12}{r['full_step_s']:9.3f}{r['lora_step_s']:9.3f}{r['update_speedup']:9.2f}"
              f"{r['full_update_bytes'] / 2**30:10.3f}{r['lora_update_bytes'] / 2**30:10.3f}"
              f"{r['update_memory_ratio']:10.3f}{r['two_merged_models_s']:12.3f}{r['batched_adapters_s']:12.3f}"
              f"{r['decode_vs_two_models']:12.2f}{r['adapter_overhead']:10.2f}")


if __name__ == "__main__":
    main()
