"""``--mesh D,F,T`` for the benchmarks: the mesh shape, and on a CPU as many simulated
devices, asked for before JAX starts (this module imports no JAX)."""

from __future__ import annotations

import math
import os
import sys


def mesh_shape(text: str) -> tuple[int, ...]:
    """``"1,8,1"`` -> ``(1, 8, 1)``: the (data, fsdp, tensor) sizes of ``--mesh``."""
    return tuple(int(n) for n in text.split(","))


def ask_for_devices(argv: list[str] = sys.argv) -> None:
    """With ``--mesh D,F,T`` in ``argv``: XLA_FLAGS asks for D x F x T host devices (call
    before importing JAX; a CPU then simulates that many)."""
    if "--mesh" in argv[:-1]:
        count = math.prod(mesh_shape(argv[argv.index("--mesh") + 1]))
        flag = f"--xla_force_host_platform_device_count={count}"
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()
