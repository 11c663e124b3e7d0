"""Sampler benchmark: swarmjax's jitted KV-cache decode vs Hugging Face ``generate``.

    python bench/sampler.py            # table
    python bench/sampler.py --json     # one JSON object

The same random Qwen3 weights (written with ``to_hf`` and loaded by
``transformers`` on the same device: the CPU, or CUDA where JAX runs on a GPU; both sides
in ``--dtype``, float32 by default, TF32 matmuls on a GPU) at two sizes (presets
``1m``, ``30m``; ``--sizes qwen3-0.6b`` for the real model's shape: 28 layers, d 1024,
151,936 logits); batch 32, prompt 64, 128 new tokens, greedy, no early stop, so both sides
generate exactly ``batch x new_tokens`` tokens; swarmjax's decode runs in
``--decode-segments`` segments (default: ``SamplingConfig``'s), each attending
over the cache up to its last slot, as HF's growing cache attends over the
tokens so far. Reported per size:

* ``compile_s``: first call minus a steady call (trace + XLA compile);
* ``swarmjax_tok_s`` / ``hf_tok_s``: generated tokens per second of a steady call
  (best of ``--repeats``; prefill included for both), and their ``ratio``;
* ``achieved_flops``: forward FLOPs of the call (prefill + decode, attention over
  the context actually present) / swarmjax's time, against ``peak_flops``, the
  float32 matmul peak measured in the same run;
* ``token_agreement``: fraction of generated tokens equal between the two (greedy
  on identical weights; float32 reductions differ in order, so near-ties may flip);
* the matmul floor of a decode step: only the step's weight matmuls (q, k, v, o,
  gate, up, down per layer and the LM head, [B, d] activations, residual adds
  between them), as a jitted ``fori_loop`` of ``new_tokens`` steps (``xla_floor_s``
  per step) and as the same torch calls (``torch_floor_s``). ``ceiling_ratio`` =
  HF's time per generated step / ``xla_floor_s``: the ratio swarmjax would reach if
  everything but these matmuls were free.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import base_parser, run_sizes, time_best, torch_setup, torch_sync  # noqa: E402

from swarmjax.models.config import preset  # noqa: E402
from swarmjax.models.hf import to_hf  # noqa: E402
from swarmjax.models.transformer import init_params  # noqa: E402
from swarmjax.sampling import Sampler, SamplingConfig  # noqa: E402


def call_flops(cfg, batch: int, prompt: int, new: int) -> float:
    """Forward FLOPs of prefill (prompt tokens, causal context) + decode steps."""
    prefill = sum(cfg.matmul_flops_per_token(context=t + 1) for t in range(prompt))
    decode = sum(cfg.matmul_flops_per_token(context=prompt + t + 1) for t in range(new - 1))
    return batch * (prefill + decode)


def bench_swarmjax(cfg, params, prompts, new: int, repeats: int, segments: int):
    sampler = Sampler(cfg, SamplingConfig(temperature=0.0, max_new_tokens=new, decode_segments=segments))
    t0 = time.perf_counter()
    out = jax.block_until_ready(sampler(params, prompts))
    first = time.perf_counter() - t0
    holder = {"cache": out.cache}

    def call():
        o = jax.block_until_ready(sampler(params, prompts, cache=holder["cache"]))
        holder["cache"], holder["tokens"] = o.cache, np.asarray(o.tokens)
    best = time_best(call, repeats)
    return first - best, best, holder["tokens"]


def bench_hf(path: str, prompts: np.ndarray, new: int, repeats: int, dtype: str):
    import torch
    import transformers

    device, tdtype = torch_setup(dtype)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=tdtype).to(device).eval()
    ids = torch.tensor(prompts, dtype=torch.long, device=device)
    kwargs = dict(attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                  do_sample=False, pad_token_id=0, eos_token_id=None)
    holder = {}

    def call():
        with torch.inference_mode():
            holder["tokens"] = model.generate(ids, **kwargs)[:, prompts.shape[1]:].cpu().numpy()
    call()  # warm-up
    return time_best(call, repeats), holder["tokens"]


def decode_matmul_floor(cfg, batch: int, steps: int, repeats: int, dtype: str) -> tuple[float, float]:
    """Seconds per decode step of the weight matmuls alone: (XLA, torch); see the
    module docstring."""
    import jax.numpy as jnp
    import torch

    d, L = cfg.hidden_size, cfg.num_layers
    q, kv, f, V = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.intermediate_size, cfg.vocab_size
    rng = np.random.RandomState(0)
    w = lambda *shape: (rng.standard_normal(shape) * 0.02).astype(np.float32)
    device, tdtype = torch_setup(dtype)
    layers = [dict(q=w(d, q), k=w(d, kv), v=w(d, kv), o=w(q, d), g=w(d, f), u=w(d, f), dn=w(f, d))
              for _ in range(L)]
    head, h0 = w(d, V), w(batch, d)

    def step(h, ws, mm):
        for lw in ws["layers"]:
            a = mm(h, lw["q"])
            h = h + mm(a, lw["o"]) + mm(h, lw["k"]).sum() * 0 + mm(h, lw["v"]).sum() * 0
            h = h + mm(mm(h, lw["g"]) * mm(h, lw["u"]), lw["dn"])
        return h + mm(h, ws["head"])[:, :d] * 1e-3

    ws = {"layers": layers, "head": head}
    jws = jax.tree.map(lambda x: jnp.asarray(x, dtype), ws)
    jh0 = jnp.asarray(h0, dtype)
    loop = jax.jit(lambda h, ws: jax.lax.fori_loop(0, steps, lambda i, h: step(h, ws, jnp.matmul), h))
    jax.block_until_ready(loop(jh0, jws))
    xla = time_best(lambda: jax.block_until_ready(loop(jh0, jws)), repeats) / steps
    tws = jax.tree.map(lambda x: torch.from_numpy(x).to(device, tdtype), ws)
    th0 = torch.from_numpy(h0).to(device, tdtype)

    def torch_loop():
        with torch.inference_mode():
            h = th0
            for _ in range(steps):
                h = step(h, tws, torch.matmul)
            torch_sync()
    torch_loop()
    return xla, time_best(torch_loop, repeats) / steps


def bench_size(name: str, args, peak: float) -> dict:
    cfg = preset(name).replace(param_dtype=args.dtype, dtype=args.dtype)   # as HF runs it
    params = init_params(cfg, jax.random.key(0))
    prompts = np.random.RandomState(0).randint(0, cfg.vocab_size, (args.batch, args.prompt_len))
    compile_s, jax_s, jax_tokens = bench_swarmjax(cfg, params, prompts, args.new_tokens, args.repeats,
                                                  args.decode_segments)
    with tempfile.TemporaryDirectory() as path:
        to_hf(cfg, params, path)
        hf_s, hf_tokens = bench_hf(path, prompts, args.new_tokens, args.repeats, args.dtype)
    xla_floor, torch_floor = decode_matmul_floor(cfg, args.batch, args.new_tokens, args.repeats, args.dtype)
    n = args.batch * args.new_tokens
    flops = call_flops(cfg, args.batch, args.prompt_len, args.new_tokens)
    return {"params": cfg.num_params(), "decode_segments": args.decode_segments, "compile_s": compile_s,
            "batch": args.batch, "prompt_len": args.prompt_len, "new_tokens": args.new_tokens, "dtype": args.dtype,
            "swarmjax_s": jax_s, "hf_s": hf_s,
            "swarmjax_tok_s": n / jax_s, "hf_tok_s": n / hf_s, "ratio": hf_s / jax_s,
            "peak_flops": peak, "achieved_flops": flops / jax_s, "mfu": flops / jax_s / peak,
            "token_agreement": float(np.mean(jax_tokens == hf_tokens)),
            "xla_floor_s": xla_floor, "torch_floor_s": torch_floor,
            "ceiling_ratio": hf_s / args.new_tokens / xla_floor}


def main() -> None:
    p = base_parser(__doc__)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--decode-segments", type=int, default=SamplingConfig().decode_segments)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="params and matmuls on both sides (and the peak's matmul)")
    args = p.parse_args()
    results, peak = run_sizes(lambda name, peak: bench_size(name, args, peak), args.sizes, dtype=args.dtype)
    if args.json:
        print(json.dumps(results))
        return
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, batch {args.batch}, prompt "
          f"{args.prompt_len}, {args.new_tokens} new tokens, greedy, {args.decode_segments} decode "
          f"segments; {args.dtype} matmul peak {peak / 1e9:.1f} GFLOP/s")
    print(f"{'size':>5} {'params':>8} {'compile s':>9} {'swarmjax tok/s':>14} {'HF tok/s':>9} "
          f"{'ratio':>6} {'GFLOP/s':>8} {'of peak':>8} {'agree':>6}")
    for name, r in results.items():
        print(f"{name:>5} {r['params'] / 1e6:>7.2f}M {r['compile_s']:>9.2f} {r['swarmjax_tok_s']:>14.0f} "
              f"{r['hf_tok_s']:>9.0f} {r['ratio']:>6.2f} {r['achieved_flops'] / 1e9:>8.1f} "
              f"{r['mfu']:>8.1%} {r['token_agreement']:>6.1%}")
    print("matmul floor of one decode step (weight matmuls only):")
    for name, r in results.items():
        print(f"{name:>5}  XLA {r['xla_floor_s'] * 1e3:6.2f} ms  torch {r['torch_floor_s'] * 1e3:6.2f} ms  "
              f"HF full step {r['hf_s'] / args.new_tokens * 1e3:6.2f} ms  swarmjax full step "
              f"{r['swarmjax_s'] / args.new_tokens * 1e3:6.2f} ms  -> ceiling ratio vs HF "
              f"{r['ceiling_ratio']:.2f}")


if __name__ == "__main__":
    main()
