"""Every benchmark in one command, each figure beside its physical floor.

    python bench/suite.py            # real sizes (qwen3-0.6b shapes): run it first whenever a GPU is lent
    python bench/suite.py --quick    # tiny shapes, every section, a few minutes on a CPU (the fast tier runs it)
    python bench/suite.py --only decode update --out results/

Each section is one of the benchmarks in ``bench/``, run as its own process with
``--json`` (so one section's memory and compiled programs do not weigh on the next); this
process measures the floors they are read against, on the same device, in the same run:

* the matmul peak (``common.matmul_peak_flops``: a jitted square matmul) for MFU;
* the memory bandwidth of a copy kernel (a jitted ``x + 1`` over a buffer far larger than
  the caches: bytes read and written per second), for the decode floor: a decode step
  reads every weight once, so ``weight bytes / bandwidth`` is the least a step can take.

Sections (:data:`SECTIONS`): ``decode`` (the sampler against ``transformers``, and its step
against its weight matmuls alone, ``bench/sampler.py``), ``profile`` (where the sampler's
time goes, by named scope: ``bench/profile_ops.py``), ``update`` (the RL update with Muon, AdamW beside it,
``bench/update.py``), ``muon`` (Muon / AdamW at 2k to 64k tokens a step, qwen3-0.6b:
Newton-Schulz's fixed cost against the step), ``moe`` (the grouped expert matmul against a dense SwiGLU of the
same active width, ``bench/moe.py``), ``swarm`` (the jitted text swarm against the
host-driven text rollout on the same episodes, ``bench/rollout_text.py``), ``rl_step`` (a
whole RL step of the agent job, ``swarmjax train`` itself: rollout + update at qwen3-0.6b,
``bench/rl_step.py``). Writes
``suite.json`` (every section's figures, the floors, the machine) and ``suite.md`` (the
table) to ``--out``, and prints the table. ``--quick`` skips ``swarm`` (its one program
compiles for minutes on a CPU at any size); its ``rl_step`` is the config's own 0.7M model.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import matmul_peak_flops, on_gpu, time_best  # noqa: E402


def copy_bandwidth(megabytes: int | None = None, repeats: int = 10) -> float:
    """Bytes a second a jitted ``x + 1`` moves (reads and writes) over a float32 buffer of
    ``megabytes`` (default 1024 on a GPU, 256 on a CPU: past the caches), updated in place
    (donated: a fresh output buffer cost a CPU its page faults, 7.5 against 53 GB/s here)."""
    megabytes = megabytes or (1024 if on_gpu() else 256)
    n = megabytes * 2 ** 20 // 4
    add = jax.jit(lambda v: v + 1.0, donate_argnums=0)   # in place: no fresh pages to fault in a CPU's copy
    holder = {"x": jax.block_until_ready(add(jnp.zeros((n,), jnp.float32)))}

    def step():
        holder["x"] = jax.block_until_ready(add(holder["x"]))
    return 2 * 4 * n / time_best(step, repeats)


@dataclasses.dataclass(frozen=True)
class Section:
    """One benchmark: its script, its flags at real sizes and quick ones, and how its JSON
    becomes table rows ``(figure, measured, floor or baseline, measured / floor)``."""

    script: str
    full: tuple[str, ...]
    quick: tuple[str, ...] | None       # None: not in --quick (say why in ``why_not_quick``)
    rows: Callable[[dict, dict], list[tuple[str, str, str, str]]]
    why_not_quick: str = ""
    gpu_flags: tuple[str, ...] = ()      # flags added at real sizes on a GPU


def _decode_rows(out: dict, floors: dict) -> list:
    rows = []
    for size, r in out.items():
        bytes_per = 2 if r.get("dtype", "float32") == "bfloat16" else 4
        step = r["swarmjax_s"] / r["new_tokens"]
        floor = r["params"] * bytes_per / floors["bandwidth"]
        rows += [(f"{size} decode step (batch {r['batch']})", f"{step * 1e3:.3f} ms",
                  f"{floor * 1e3:.3f} ms weights / bandwidth", f"{step / floor:.2f}x floor"),
                 (f"{size} decode step vs its weight matmuls alone", f"{step * 1e3:.3f} ms",
                  f"{r['xla_floor_s'] * 1e3:.3f} ms matmuls", f"{step / r['xla_floor_s']:.2f}x"),
                 (f"{size} decode vs transformers", f"{r['swarmjax_tok_s']:.0f} tok/s",
                  f"{r['hf_tok_s']:.0f} tok/s", f"{r['ratio']:.2f}x")]
    return rows


def _update_rows(out: dict, floors: dict) -> list:
    rows = []
    for size, r in out.items():
        rows += [(f"{size} update, Muon ({r['tokens_per_step']} tokens)", f"{r['step_s']:.3f} s",
                  f"{r['achieved_flops'] / 1e9:.1f} GFLOP/s of {r['peak_flops'] / 1e9:.1f}", f"MFU {r['mfu']:.1%}"),
                 (f"{size} update, Muon / AdamW", f"{r['step_s']:.3f} s", f"{r['adamw_step_s']:.3f} s",
                  f"{r['muon_over_adamw']:.2f}x")]
    return rows


def _muon_rows(out: dict, floors: dict) -> list:
    return [(f"{size} Muon / AdamW at {row['tokens']} tokens a step", f"{row['muon_step_s']:.3f} s",
             f"{row['adamw_step_s']:.3f} s AdamW", f"{row['muon_over_adamw']:.2f}x")
            for size, r in out.items() for row in r.get("sweep", ())]


def _moe_rows(r: dict, floors: dict) -> list:
    return [(f"MoE {r['experts']} experts, {r['k']} a token ({r['tokens']} tokens)", f"{r['moe_s'] * 1e3:.2f} ms",
             f"{r['dense_s'] * 1e3:.2f} ms dense, same active width", f"{r['moe_over_dense']:.2f}x, MFU {r['moe_mfu']:.1%}")]


def _profile_rows(r: dict, floors: dict, top: int = 6) -> list:
    return [(f"{r['size']} sampler call: {g['group']}", f"{g['ms']:.1f} ms",
             "" if g["ms_per_step"] is None else f"{g['ms_per_step']:.3f} ms a decode step", f"{g['share']:.1%}")
            for g in r["groups"][:top]]


def _swarm_rows(r: dict, floors: dict) -> list:
    return [(f"text swarm, {r['batch']} episodes: jitted vs host", f"{r['jit_s']:.3f} s", f"{r['host_s']:.3f} s host",
             f"{r['ratio']:.2f}x (bound {r['ratio_bound_same_device_work']:.2f}x)")]


def _rl_step_rows(r: dict, floors: dict) -> list:
    return [(f"RL step, {r['size']} ({r['episodes']} episodes)", f"{r['step_s']:.2f} s",
             f"rollout {r['rollout_s']:.2f} s ({r['rollout_tok_s']:.0f} tok/s) + update {r['update_s']:.2f} s",
             f"update {r['update_share']:.0%}"),
            (f"RL step 0, {r['size']} (compiles)", f"{r['first_step_s']:.2f} s", f"{r['step_s']:.2f} s a later step",
             f"{r['first_step_s'] / r['step_s']:.1f}x")]


BF16 = ("--dtype", "bfloat16")

SECTIONS: dict[str, Section] = {
    "decode": Section("sampler.py",
                      ("--sizes", "qwen3-0.6b", "--batch", "32", "--prompt-len", "64", "--new-tokens", "128"),
                      ("--sizes", "tiny", "--batch", "2", "--prompt-len", "8", "--new-tokens", "8", "--repeats", "1"),
                      _decode_rows, gpu_flags=BF16),
    "profile": Section("profile_ops.py", ("--size", "qwen3-0.6b", "--batch", "32", "--prompt-len", "64",
                                          "--new-tokens", "128"),
                       ("--size", "tiny", "--batch", "2", "--prompt-len", "8", "--new-tokens", "8"), _profile_rows,
                       gpu_flags=BF16),
    "update": Section("update.py", ("--sizes", "qwen3-0.6b", "--batch", "16", "--seq", "512", "--repeats", "2"),
                      ("--sizes", "tiny", "--batch", "2", "--seq", "32", "--repeats", "1"), _update_rows),
    "muon": Section("update.py", ("--sizes", "qwen3-0.6b", "--batch", "4", "--seq", "512", "--repeats", "2",
                                  "--tokens-sweep", "2048", "8192", "16384", "65536"), None, _muon_rows,
                    why_not_quick="its point is real token counts (2k to 64k a step)"),
    "moe": Section("moe.py", ("--tokens", "8192", "--hidden", "1024", "--experts", "64", "--k", "8",
                              "--expert-width", "768"),
                   ("--tokens", "256", "--hidden", "64", "--experts", "4", "--expert-width", "64", "--repeats", "1"),
                   _moe_rows),
    "swarm": Section("rollout_text.py", ("--text", "--batch", "32"), None, _swarm_rows,
                     why_not_quick="the jitted swarm's one program compiles for minutes on a CPU at any size"),
    "rl_step": Section("rl_step.py", ("--size", "qwen3-0.6b", "--steps", "3"),
                       ("--size", "config", "--steps", "2", "--tasks", "2", "--group", "4"), _rl_step_rows),
}


def run_section(name: str, *, quick: bool, timeout: float) -> tuple[dict | None, float, str]:
    """(the section's JSON or None, seconds, its stderr's last lines when it failed)."""
    s = SECTIONS[name]
    if quick and s.quick is None:
        return None, 0.0, f"skipped with --quick: {s.why_not_quick}"
    flags = list(s.quick) if quick else list(s.full) + list(s.gpu_flags if on_gpu() else ())
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, os.path.join(HERE, s.script), *flags, "--json"], capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, time.perf_counter() - t0, f"timed out after {timeout:g} s"
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        return None, seconds, "\n".join(proc.stderr.strip().splitlines()[-5:])
    return json.loads(proc.stdout.strip().splitlines()[-1]), seconds, ""


def table(results: dict, floors: dict) -> str:
    """The markdown table of every section's rows (a failed section: its error)."""
    lines = [f"jax {floors['jax']} on {floors['device']}: float32 matmul peak {floors['peak_flops'] / 1e9:.1f} "
             f"GFLOP/s, copy bandwidth {floors['bandwidth'] / 1e9:.1f} GB/s",
             "", "| section | figure | measured | floor / baseline | ratio |", "|---|---|---|---|---|"]
    for name, r in results.items():
        if r["figures"] is None:
            what = "skipped" if r["error"].startswith("skipped") else f"failed ({r['seconds']:.0f} s)"
            lines.append(f"| {name} | {what} | {r['error'].splitlines()[-1] if r['error'] else ''} | | |")
            continue
        for row in SECTIONS[name].rows(r["figures"], floors):
            lines.append(f"| {name} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny shapes (a few minutes on a CPU)")
    p.add_argument("--only", nargs="+", choices=list(SECTIONS), help="these sections only")
    p.add_argument("--out", default="bench_results", help="directory for suite.json and suite.md")
    p.add_argument("--timeout", type=float, default=None, help="seconds a section may take (default 600, quick 180)")
    args = p.parse_args(argv)
    timeout = args.timeout or (180.0 if args.quick else 600.0)
    floors = {"jax": jax.__version__, "device": str(jax.devices()[0].device_kind), "backend": jax.default_backend(),
              "peak_flops": matmul_peak_flops(), "bandwidth": copy_bandwidth(64 if args.quick else None)}
    results = {}
    for name in args.only or list(SECTIONS):
        print(f"[{name}] {SECTIONS[name].script} ...", flush=True)
        figures, seconds, error = run_section(name, quick=args.quick, timeout=timeout)
        results[name] = {"figures": figures, "seconds": seconds, "error": error}
        state = "done" if figures is not None else "skipped" if error.startswith("skipped") else "FAILED"
        print(f"[{name}] {state} in {seconds:.1f} s"
              + (f": {error}" if error else ""), flush=True)
    text = table(results, floors)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "suite.json"), "w") as f:
        json.dump({"quick": args.quick, "floors": floors, "sections": results}, f, indent=1)
    with open(os.path.join(args.out, "suite.md"), "w") as f:
        f.write(text + "\n")
    print(text)
    return 0 if all(r["figures"] is not None or r["error"].startswith("skipped") for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
