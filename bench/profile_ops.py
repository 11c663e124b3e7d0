"""Where a jitted call's time goes: one call traced with ``jax.profiler``, each XLA op's wall
time summed by the model's named scopes.

    python bench/profile_ops.py                                  # the sampler: 30m, batch 32, 64 + 128 ids
    python bench/profile_ops.py --size qwen3-0.6b --dtype bfloat16 --json

Every op the trace records (XLA:CPU's thunks, with ``--xla_cpu_enable_xprof_traceme``, which
this script sets; a GPU's kernels) is mapped through its ``hlo_op`` to the compiled module's
``op_name`` metadata (``jit(fn)/while/body/Block/attention/attn/BKGTH,BKHS->BKGTS/dot_general``)
and grouped as ``phase / scope / op``:

* phase: ``loop`` for ops inside a ``while`` body (a sampler's decode steps), else ``outside``
  (its prefill, the copies before and after);
* scope: ``attention`` / ``mlp`` (the model's ``jax.named_scope``s), ``head`` (the logits'
  einsum), else ``other``;
* op: the einsum's spec for a ``dot_general`` (``dot`` when unnamed), else the primitive.

Ops that run at once (XLA:CPU runs independent thunks on several threads) share their
overlap equally, so the groups' times add up to the traced busy time, not more. Reported per
group: milliseconds per call, share of the busy time, and milliseconds per decode step for the
``loop`` groups.
"""

from __future__ import annotations

import collections
import glob
import json
import os
import re
import sys
import tempfile
import time

if __name__ == "__main__":      # before JAX starts: XLA:CPU records its thunks only with this flag
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_enable_xprof_traceme=true").strip()

import jax  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def op_names(hlo_text: str) -> dict[str, str]:
    """``{instruction name: op_name metadata}`` of a compiled module's text."""
    names = {}
    for line in hlo_text.splitlines():
        m = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = .*?op_name=\"([^\"]*)\"", line)
        if m:
            names[m.group(1)] = m.group(2)
    return names


def group_of(op_name: str) -> str:
    """``phase / scope / op`` of one op's metadata (see the module docstring)."""
    phase = "loop" if "/while/body/" in op_name else "outside"
    parts = [p for p in op_name.split("/") if p and not p.startswith(("jit(", "pjit(")) and
             p not in ("while", "body", "cond", "closed_call", "Block")]
    scope = "attention" if any(p in ("attention", "attn") for p in parts) else \
        "mlp" if "mlp" in parts else "head" if any(p.endswith("V") and "->" in p for p in parts) else "other"
    op = parts[-1] if parts else "unnamed"
    if op == "dot_general":
        specs = [p for p in parts if "->" in p]
        op = f"{specs[-1]} dot" if specs else "dot"
    return f"{phase} / {scope} / {op}"


def traced_ops(xplane_path: str, module: str) -> list[tuple[str, float, float]]:
    """``(hlo_op, start_ns, duration_ns)`` of every op of ``module`` in a trace: a device
    plane's (GPU kernels) where there is one, else the host threads' (XLA:CPU thunks)."""
    from jax.profiler import ProfileData

    data = ProfileData.from_file(xplane_path)
    found: dict[bool, list] = {True: [], False: []}
    for plane in data.planes:
        on_device = plane.name.startswith("/device:")
        for line in plane.lines:
            for e in line.events:
                stats = dict(e.stats)
                if "hlo_op" in stats and str(stats.get("hlo_module", "")) == module:
                    found[on_device].append((str(stats["hlo_op"]), e.start_ns, e.duration_ns))
    return found[True] or found[False]


def wall_shares(ops: list[tuple[str, float, float]]) -> tuple[list[float], float]:
    """Each op's share of the wall clock (overlapping ops split their overlap equally) and
    the busy time (the union of the ops' intervals), in nanoseconds."""
    edges = sorted([(s, 1, i) for i, (_, s, d) in enumerate(ops)] + [(s + d, 0, i) for i, (_, s, d) in enumerate(ops)])
    share, running, last, busy = [0.0] * len(ops), set(), None, 0.0
    for t, starts, i in edges:
        if running:
            for j in running:
                share[j] += (t - last) / len(running)
            busy += t - last
        last = t
        (running.add if starts else running.discard)(i)
    return share, busy


def op_breakdown(call, compiled, *, loop_steps: int = 0) -> dict:
    """Trace one ``call()`` (it must block until done) of the jitted program ``compiled``
    (a ``jax.stages.Compiled``) and sum its ops' wall time by :func:`group_of`.

    Returns ``{"wall_s", "busy_s", "ops", "groups": [{"group", "ms", "share", "ms_per_step"}]}``,
    the groups largest first; ``ms_per_step`` divides a ``loop`` group by ``loop_steps``."""
    text = compiled.as_text()
    module = re.search(r"HloModule (\S+?)[,\s]", text).group(1)
    names = op_names(text)
    with tempfile.TemporaryDirectory() as d:
        jax.profiler.start_trace(d)
        t0 = time.perf_counter()
        call()
        wall = time.perf_counter() - t0
        jax.profiler.stop_trace()
        paths = glob.glob(os.path.join(d, "plugins", "profile", "*", "*.xplane.pb"))
        ops = traced_ops(paths[0], module) if paths else []
    if not ops:
        raise RuntimeError(f"the trace holds no op of {module} (XLA:CPU records ops only with "
                           "XLA_FLAGS=--xla_cpu_enable_xprof_traceme=true, set before JAX starts)")
    share, busy = wall_shares(ops)
    totals: dict[str, float] = collections.Counter()
    for (name, _, _), ns in zip(ops, share):
        totals[group_of(names.get(name, name))] += ns
    groups = [{"group": g, "ms": ns / 1e6, "share": ns / busy,
               "ms_per_step": ns / 1e6 / loop_steps if loop_steps and g.startswith("loop") else None}
              for g, ns in sorted(totals.items(), key=lambda kv: -kv[1])]
    return {"wall_s": wall, "busy_s": busy / 1e9, "ops": len(ops), "groups": groups}


def profile_sampler(size: str, *, batch: int, prompt_len: int, new_tokens: int, dtype: str,
                    segments: int | None = None) -> dict:
    """:func:`op_breakdown` of one steady ``Sampler`` call (greedy, no early stop) on random
    weights of preset ``size``."""
    import jax.numpy as jnp

    from swarmjax.models.config import preset
    from swarmjax.models.transformer import init_params
    from swarmjax.sampling import Sampler, SamplingConfig

    cfg = preset(size).replace(param_dtype=dtype, dtype=dtype)
    params = init_params(cfg, jax.random.key(0))
    prompts = jnp.asarray(np.random.RandomState(0).randint(0, cfg.vocab_size, (batch, prompt_len)), jnp.int32)
    scfg = SamplingConfig(temperature=0.0, max_new_tokens=new_tokens,
                          **({} if segments is None else {"decode_segments": segments}))
    sampler = Sampler(cfg, scfg)
    holder = {"cache": jax.block_until_ready(sampler(params, prompts)).cache}

    def call():
        holder["cache"] = jax.block_until_ready(sampler(params, prompts, cache=holder["cache"])).cache
    call()
    (jitted,) = sampler._jitted.values()
    mask = jnp.ones((batch, prompt_len), bool)
    compiled = jitted.lower(params, prompts, mask, jax.random.key(0), holder["cache"], None, None, None).compile()
    out = op_breakdown(call, compiled, loop_steps=new_tokens - 1)
    return {"size": size, "batch": batch, "prompt_len": prompt_len, "new_tokens": new_tokens, "dtype": dtype,
            "device": jax.devices()[0].device_kind, **out}


def table(r: dict, top: int = 20) -> str:
    lines = [f"{r['size']} sampler, batch {r['batch']}, {r['prompt_len']} + {r['new_tokens']} ids, {r['dtype']} on "
             f"{r['device']}: call {r['wall_s'] * 1e3:.1f} ms, ops busy {r['busy_s'] * 1e3:.1f} ms ({r['ops']} ops)",
             "", "| phase / scope / op | ms a call | share | ms a decode step |", "|---|---|---|---|"]
    for g in r["groups"][:top]:
        step = "" if g["ms_per_step"] is None else f"{g['ms_per_step']:.3f}"
        lines.append(f"| {g['group']} | {g['ms']:.1f} | {g['share']:.1%} | {step} |")
    rest = r["groups"][top:]
    if rest:
        lines.append(f"| {len(rest)} more groups | {sum(g['ms'] for g in rest):.1f} | "
                     f"{sum(g['share'] for g in rest):.1%} | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="30m")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--decode-segments", type=int, default=None)
    p.add_argument("--top", type=int, default=20, help="rows of the table (the rest summed)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    r = profile_sampler(args.size, batch=args.batch, prompt_len=args.prompt_len, new_tokens=args.new_tokens,
                        dtype=args.dtype, segments=args.decode_segments)
    print(json.dumps(r) if args.json else table(r, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
