"""Shared fixtures. The suite runs with 8 simulated CPU devices so sharded and
unsharded code are tested in one process (1-device code uses device 0)."""

import gc
import os

_FLAG = "--xla_force_host_platform_device_count=8"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()
# The suite spent more than half its time in XLA's CPU compiler (a full run on the 2-core
# machine: 1104 s of 1965 s of tests, 4303 programs). With LLVM's backend optimisations off
# the programs compile faster than they then run slower: 673 s of 1581 s, the suite 1003 s ->
# 810 s. The subprocesses the tests start inherit it (test_resume and test_job:
# small_job.subprocess_xla_flags), except the learning test's, whose time is in running
# (tests/test_learning.py). A level set by the caller is kept.
if "xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_backend_optimization_level=0"
# XLA's CPU fusion emitters (MLIR, on by default) took about half of what was left of the
# compile time: tests/test_text_rollout.py's context test compiled its 31 programs in 21.9 s
# with them and 10.8 s without (the test 37.8 s -> 24.5 s). Float results may differ in their
# last bits from a default build's; the suite compares programs built with the same flags.
if "xla_cpu_use_fusion_emitters" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_cpu_use_fusion_emitters=false"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One persistent compilation cache for the session (and the subprocesses it starts):
# many tests build new jitted callables (trainers, engines, CLI jobs) for programs an
# earlier test or module already compiled; jax.clear_caches() below drops the in-memory
# copies, the on-disk entry stays (keyed by the program text, so a changed program
# compiles afresh). A directory set by the caller is used as is.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    import atexit
    import shutil
    import tempfile

    _CACHE = tempfile.mkdtemp(prefix="swarmjax-test-jax-cache-")
    atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _CACHE
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.1")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from swarmjax.models import ModelConfig, init_params  # noqa: E402


def spread(params, scale=8.0):
    """Random-init weights are tiny (std 0.02), so a random model repeats its last
    token; scaling the matrices makes greedy decoding exercise many different ids."""
    return jax.tree.map(lambda x: x * scale if x.ndim >= 2 else x, params)


# The test files that take the longest on the 2-core CPU machine (a clean clone's whole
# suite with `--durations=0`, summed per file: 20-200 s each), heaviest first. `pytest
# -n 2 --dist loadfile` hands whole files to the two workers in collection order, so these
# go first and the short files fill in behind them (longest-processing-time-first). xdist's
# default order (files with the most tests first) put the few-test, minute-long files
# (multihost, resume, learning) last: one worker ran 997 s of tests, the other 775 s, then waited.
HEAVY_FIRST = ("test_text_parl.py", "test_job.py", "test_examples.py", "test_resume.py", "test_learning.py",
               "test_text_engine.py", "test_text_rollout.py", "test_swarm.py", "test_device_calls.py", "test_plan.py",
               "test_colab.py", "test_update.py", "test_synth_engine.py", "test_sft.py", "test_text_job.py",
               "test_cli.py", "test_token_host_env.py")


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):        # pytest-xdist: keep the order set below
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))      # stable: the rest keep their order


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drop every compiled program after each test module. Each XLA:CPU executable keeps
    a few memory mappings of JIT-compiled code alive, the suite compiles tens of thousands
    of programs, and a process past the kernel's ``vm.max_map_count`` (65530 by default)
    crashed inside XLA's compiler with a segmentation fault when LLVM's mmap failed
    (measured: three text/swarm test files left 38,792 mappings)."""
    yield
    jax.clear_caches()
    gc.collect()


@pytest.fixture(scope="session")
def tiny_cfg():
    # untied, GQA with 2 query heads per kv head, qk-norm: every code path of the model.
    return ModelConfig(vocab_size=96, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                       head_dim=8, intermediate_size=64, tie_embeddings=False)


@pytest.fixture(scope="session")
def tiny_params(tiny_cfg):
    return spread(init_params(tiny_cfg, jax.random.key(0)))


@pytest.fixture
def rng():
    return np.random.RandomState(0)
