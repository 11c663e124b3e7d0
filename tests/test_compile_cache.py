"""JAX's persistent compilation cache as jobs use it: where it goes, and a second process
loading what the first compiled (counted by the CompileClock, not timed)."""

import json
import os
import subprocess
import sys

from swarmjax.train.compile_cache import ENV, cache_dir

PROGRAM = """
import json, sys
import jax, jax.numpy as jnp
from swarmjax.train.compile_cache import CompileClock, cache_dir, enable
enable(cache_dir(sys.argv[1]))
with CompileClock() as clock:
    f = jax.jit(lambda x: jnp.tanh(x @ x.T).sum(0) * 3.0)
    jax.block_until_ready(f(jnp.ones((64, 32))))
print(json.dumps(clock.figures()))
"""


def test_cache_dir_resolution(monkeypatch, tmp_path):
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_dir() == str(tmp_path / "swarmjax" / "xla")
    assert cache_dir("gs://bucket/xla") == "gs://bucket/xla" and cache_dir("off") is None
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "/jax/own")
    assert cache_dir() == "/jax/own"
    monkeypatch.setenv(ENV, "off")
    assert cache_dir() is None and cache_dir("/explicit") == "/explicit"


def test_a_second_process_loads_what_the_first_compiled(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}

    def run(cache):
        out = subprocess.run([sys.executable, "-c", PROGRAM, cache], env=env, capture_output=True, text=True,
                             check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])

    first, second = run(str(tmp_path / "xla")), run(str(tmp_path / "xla"))
    assert first["cache_misses"] >= 1 and first["cache_hits"] == 0 and first["compile_s"] > 0
    assert second["cache_hits"] == first["cache_misses"] and second["cache_misses"] == 0
    off = run("off")
    assert off["cache_hits"] == off["cache_misses"] == 0 and os.listdir(tmp_path / "xla")
