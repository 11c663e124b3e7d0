"""``swarmjax export``: a training run's policy as a Hugging Face checkpoint directory
(:mod:`swarmjax.train.export`).

    swarmjax export --workdir runs/units --checkpoint best --out exported/ --dtype bfloat16
"""

from __future__ import annotations

import argparse

from swarmjax.cli import register


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workdir", required=True, help="a text training run's workdir")
    p.add_argument("--checkpoint", default="latest", help="'latest', 'best' (validation accuracy) or an RL step")
    p.add_argument("--out", required=True, help="directory to write (config.json, safetensors, tokenizer files, "
                                                "generation_config.json)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), help="cast the weights (default: as trained)")
    p.add_argument("--adapter", action="store_true",
                   help="a LoRA run: write its adapter as a PEFT directory (adapter_config.json, "
                        "adapter_model.safetensors) instead of the merged model")


def run(args: argparse.Namespace) -> int:
    from swarmjax.train.export import export_run

    out = export_run(args.workdir, args.out, which=args.checkpoint, dtype=args.dtype, adapter=args.adapter)
    print(f"exported RL step {out['step']} of {args.workdir} to {args.out} ({out['dtype']}; eos ids "
          f"{out['eos_token_id']}): {', '.join(out['files'])}")
    return 0


register("export", "write a training run's policy as a Hugging Face checkpoint (weights, tokenizer, eos ids)")(
    (add_arguments, run))
