# %% [markdown]
# *To open in Colab:* upload this notebook (*File > Upload notebook*) and a clone of the
# repository unzipped in `/content/swarmjax`, or open it from your fork on GitHub
# (`python colab/sync.py --org OWNER` puts an Open-in-Colab badge for it here).
#
# # swarmjax quickstart: train an orchestrator that delegates to a swarm
#
# This notebook installs swarmjax, looks at the accelerator it runs on, trains a small
# orchestrator (a warm start by imitation, then PARL: GSPO with Muon, the warm start frozen
# as the sub-agents), then shows the run's summary table, its learning curves, the Gantt
# chart of one evaluation episode, and how an interrupted or extended run resumes.
#
# **Runtime.** *Runtime > Change runtime type > TPU* (the notebook's default), or GPU, or
# CPU: the same code runs on each. The model is tiny (0.6M parameters), so a TPU is not
# much faster than a CPU here; the point is that nothing changes between them.
#
# The notebook's source is `colab/quickstart.py` in the repository (a jupytext percent
# file); `python colab/sync.py` regenerates this `.ipynb` from it.

# %% [markdown]
# ## 1. Install
#
# Colab comes with `jax` built for its accelerator. The cell keeps that `jax` (and `jaxlib`)
# while it installs swarmjax, unless it is older than the version swarmjax requires; then it
# installs a newer one for the accelerator it finds. Inside a checkout of the repository
# (CI, a local Jupyter) it installs nothing when swarmjax is already importable, and the
# checkout otherwise (on Colab: a clone unzipped in `/content/swarmjax`). To install from
# GitHub instead, set `ORG` to the owner of your swarmjax repository.

# %%
ORG = ""              # GitHub owner of your swarmjax repository ("": a local clone)
REF = "main"          # branch, tag or commit to install
JAX_MIN = "0.7"       # pyproject.toml's requirement, jax>=0.7 (tests/test_colab.py keeps them equal)

import glob
import importlib
import importlib.metadata
import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile


def installed(package):
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def release(version):
    """'0.7.2rc1' -> (0, 7, 2): the leading numbers of a version."""
    out = []
    for part in version.split(".")[:3]:
        digits = ""
        for ch in part:
            if not ch.isdigit():
                break
            digits += ch
        out.append(int(digits or 0))
    return tuple(out)


def source_tree():
    """A swarmjax checkout: the one an installed swarmjax runs from (an editable install,
    CI), or one around the working directory or in its ``swarmjax`` folder (a clone
    uploaded to Colab's /content); None on a plain Colab runtime."""
    spec = importlib.util.find_spec("swarmjax")
    places = [pathlib.Path(spec.origin).resolve().parent.parent] if spec and spec.origin else []
    places += [pathlib.Path.cwd(), pathlib.Path.cwd() / "swarmjax", *pathlib.Path.cwd().parents]
    for d in places:
        project = d / "pyproject.toml"
        if project.is_file() and (d / "configs").is_dir() and 'name = "swarmjax"' in project.read_text():
            return d
    return None


def accelerator():
    """'tpu', 'gpu' or 'cpu', found without importing jax (an upgrade must come first)."""
    if (os.environ.get("COLAB_TPU_ADDR") or os.environ.get("TPU_ACCELERATOR_TYPE")
            or glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*")):
        return "tpu"
    return "gpu" if shutil.which("nvidia-smi") else "cpu"


SRC = source_tree()
if importlib.util.find_spec("swarmjax") is not None:
    print(f"swarmjax {installed('swarmjax')} is installed{f' from {SRC}' if SRC else ''}: nothing to install")
elif SRC is None and not ORG:
    raise ValueError("no swarmjax to install: unzip a clone of the repository in /content/swarmjax, or set ORG "
                     "(the first line of this cell) to the GitHub owner of your swarmjax repository")
else:
    pip = [sys.executable, "-m", "pip", "install", "-q"]
    jax_version = installed("jax")
    if jax_version is None or release(jax_version) < release(JAX_MIN):
        extra = {"tpu": "[tpu]", "gpu": "[cuda12]", "cpu": ""}[accelerator()]
        print(f"jax {jax_version} is older than {JAX_MIN}: installing jax{extra}>={JAX_MIN}")
        subprocess.check_call(pip + ["-U", f"jax{extra}>={JAX_MIN}"])
        if "jax" in sys.modules:
            print("jax was imported before the upgrade: Runtime > Restart session, then run from the top")
    # pin the jax that is there while pip resolves swarmjax's other requirements
    keep = os.path.join(tempfile.mkdtemp(), "keep-jax.txt")
    pathlib.Path(keep).write_text("".join(f"{p}=={installed(p)}\n" for p in ("jax", "jaxlib") if installed(p)))
    target = ["-e", str(SRC)] if SRC else [f"swarmjax @ git+https://github.com/{ORG}/swarmjax@{REF}"]
    print("pip install", *target)
    try:
        subprocess.check_call(pip + ["-c", keep, *target])
    except subprocess.CalledProcessError:
        print(f"pip could not install swarmjax beside {open(keep).read().split()}: see its message above")
        raise
    if SRC:
        sys.path.insert(0, str(SRC))      # an editable install's path hook loads at the next start
    importlib.invalidate_caches()

import swarmjax  # noqa: E402

print("swarmjax", installed("swarmjax"), "at", os.path.dirname(swarmjax.__file__))

# %% [markdown]
# The job's config is a Python file of the repository (`configs/parl_widesearch_cpu.py`, the
# README's CPU default). A pip install does not carry it: outside a checkout, fetch it from
# the same repository and ref.

# %%
import urllib.request  # noqa: E402

if SRC is not None:
    CONFIG = str(SRC / "configs" / "parl_widesearch_cpu.py")
else:
    CONFIG = "configs/parl_widesearch_cpu.py"
    os.makedirs("configs", exist_ok=True)
    urllib.request.urlretrieve(
        f"https://raw.githubusercontent.com/{ORG}/swarmjax/{REF}/configs/parl_widesearch_cpu.py", CONFIG)
print("config:", CONFIG)

# %% [markdown]
# ## 2. The backend
#
# `jax.default_backend()` is `tpu`, `gpu` or `cpu`. The job below runs on one device
# (`--set mesh.data=8` would spread its rollouts and updates over a mesh of 8).

# %%
import jax  # noqa: E402

BACKEND = jax.default_backend()
KIND = {"tpu": "TPU", "gpu": "GPU", "cuda": "GPU", "rocm": "GPU", "cpu": "CPU"}.get(BACKEND, BACKEND)
print(f"jax {jax.__version__}: backend {BACKEND!r} ({KIND}), {jax.device_count()} device(s), "
      f"{jax.process_count()} process(es)")
for d in jax.devices()[:8]:
    print("  ", d, "-", d.device_kind)
if KIND == "CPU":
    print("No accelerator: fine for this job (Runtime > Change runtime type for a TPU or GPU).")

# %% [markdown]
# ## 3. Train
#
# `swarmjax train` runs the whole job: it prepares a task set (wide search: look up `n`
# entities, alone or through up to 8 parallel sub-agents), trains the warm start, then runs
# PARL with periodic evaluations on held-out tasks, checkpoints, traces, and at the end
# writes `summary.json` / `summary.md` and `curves.png` into the workdir.
#
# Three sizes of job:
#
# * the default here: the README's config with a shorter warm start (600 steps instead of
#   2000) and 40 PARL steps, 5-10 minutes on a 2-core CPU. It already learns to spread a
#   16-entity task over all 8 sub-agents (17 -> 5 critical steps) but still drops entities
#   on the way (item-F1 0.63 at n = 16 in one CPU run, against 0.97 for the warm start);
# * `FULL = True`: the README's job as it is (2000 warm-start steps, 300 PARL steps; about
#   13 minutes on a 2-core CPU), which does the same at item-F1 0.96-1.0 (README.md);
# * `SWARMJAX_SMOKE=1` in the environment (what the repository's tests set): a tiny task
#   and model, a few steps, so the whole notebook runs in well under a minute.
#
# The commands run in this Python process through `swarmjax.cli.main`, exactly as
# `!swarmjax train ...` would in a shell, but without a second process: a TPU can be held
# by one process at a time, and this notebook's has it since the cell above.

# %%
import json  # noqa: E402
import shlex  # noqa: E402
import time  # noqa: E402

from IPython.display import Image, Markdown, display  # noqa: E402

from swarmjax.cli import main as swarmjax_cli  # noqa: E402

SMOKE = os.environ.get("SWARMJAX_SMOKE") == "1"
FULL = False

if SMOKE:       # a 4-entity task, 2 sub-agents, a 1-layer model: seconds of work, mostly compilation
    JOB = ["task.cfg.num_entities=16", "task.cfg.num_values=16",
           "task.cfg.max_task_size=4", "task.cfg.max_subagents=2",
           "task.cfg.contexts.orchestrator=48", "rl.parl.parallel_target=4", "task.data.focus_min_n=3",
           "model.hidden_size=32", "model.head_dim=8", "model.intermediate_size=64", "model.num_layers=1",
           "sft.steps=40", "sft.bucket=48", "sft.demos=32", "sft.eval_demos=8",
           "rl.tasks_per_step=2", "rl.group_size=4", "rl.update.num_minibatches=2",
           "task.data.train_size=64", "task.data.validation_size=64", "task.data.test_size=64",
           "task.eval_sizes=(1, 4)", "eval_episodes=8", "eval_every=2", "checkpoint.every=2"]
    STEPS, MORE = 2, 2
elif FULL:
    JOB, STEPS, MORE = [], 300, 50
else:
    JOB = ["sft.steps=600", "sft.optim.decay_steps=600", "eval_every=20", "checkpoint.every=20"]
    STEPS, MORE = 40, 20
WORKDIR = "runs/quickstart"


def swarmjax(*args):
    """Run ``swarmjax ARGS...`` in this process; fails the cell on a non-zero exit code."""
    print("$ swarmjax", shlex.join(args), flush=True)
    t0 = time.perf_counter()
    rc = swarmjax_cli(list(args))
    assert rc == 0, f"swarmjax exited with {rc}"
    print(f"[{time.perf_counter() - t0:.0f} s]")


def train(rl_steps):
    sets = [a for s in JOB + [f"rl.steps={rl_steps}"] for a in ("--set", s)]
    swarmjax("train", "--config", CONFIG, "--workdir", WORKDIR, "--resume", "auto", *sets,
             *(["--no-progress"] if SMOKE else []))


train(STEPS)

# %% [markdown]
# ## 4. The summary table
#
# Warm start ("initial") against the final policy on the test split, every job's figures,
# then per task size `n`: accuracy (the answer's item-F1), answered, sub-agents spawned, the
# fraction of episodes without any (`no_spawn`), critical steps (the episode's length when
# parallel sub-agents count once) and total steps (all agents' work). The greedy warm start
# is serial; PARL should cut the critical steps of large tasks by delegating, and leave
# `n = 1` alone. (The smoke job's tiny model learns nothing:
# its table only shows the format.)

# %%
summary = json.loads(open(f"{WORKDIR}/summary.json").read())
display(Markdown(open(f"{WORKDIR}/summary.md").read()))
print(f"{summary['rl_steps']} PARL steps, {summary['wall_clock_s']:.0f} s on {summary['device']}")
print("written:", ", ".join(sorted(os.listdir(WORKDIR))))

# %% [markdown]
# ## 5. Learning curves
#
# `curves.png`: the warm start's loss, then per PARL step the batch means of the reward,
# item-F1, critical steps and sub-agents of the training rollouts. Every number behind it
# is a line of `metrics.jsonl` (and evaluations are in `eval.jsonl`).

# %%
display(Image(filename=f"{WORKDIR}/curves.png"))
parl = [r for r in map(json.loads, open(f"{WORKDIR}/metrics.jsonl")) if r["stage"] == "rl"]
for r in parl[-3:]:
    print(f"PARL step {r['step']}: reward {r['reward']:.3f}, item-F1 {r['accuracy']:.2f}, "
          f"critical steps {r['critical_steps']:.1f}, sub-agents {r['subagents']:.2f}")

# %% [markdown]
# ## 6. A trace and its Gantt chart
#
# Evaluation episodes are saved as orchestration traces (`traces.jsonl`: every agent's turns,
# tool calls and results, linked by spawn / return edges, with each reward channel).
# `swarmjax trace show FILE --png OUT` prints one as a timeline and draws its Gantt chart:
# agents against critical steps, parallel sub-agents as stacked bars. Here: the final
# policy's episode on the largest task size.

# %%
from swarmjax.traces.render import load_traces  # noqa: E402

traces = load_traces(f"{WORKDIR}/traces.jsonl")
print(len(traces), "traces:", ", ".join(t["trace_id"] for t in traces))
last = max(i for i, t in enumerate(traces) if t["trace_id"].startswith("final"))
swarmjax("trace", "show", f"{WORKDIR}/traces.jsonl", "--index", str(last), "--png", f"{WORKDIR}/gantt.png")
display(Image(filename=f"{WORKDIR}/gantt.png"))

# %% [markdown]
# For comparison, what a trained swarm looks like: `swarmjax trace demo` writes two scripted
# episodes of one 16-entity task, serial (17 critical steps) and 8 sub-agents x 2 lookups (5).

# %%
swarmjax("trace", "demo", f"{WORKDIR}/demo.jsonl")
from swarmjax.traces.render import save_gantt  # noqa: E402

display(Image(filename=save_gantt(load_traces(f"{WORKDIR}/demo.jsonl")[1], f"{WORKDIR}/demo_gantt.png")))

# %% [markdown]
# ## 7. Resume
#
# Every `train` call above passes `--resume auto`: continue from the workdir's newest
# finished checkpoint if there is one, else start afresh. So this notebook's cells can be
# rerun, and a run that Colab disconnected (or a preempted TPU VM) continues where its last
# checkpoint left off: on a lost runtime, put the workdir on Google Drive or a `gs://`
# bucket (`WORKDIR = "/content/drive/MyDrive/runs/quickstart"` after mounting Drive) and
# run the notebook again. A resumed run computes exactly what an uninterrupted one would.
#
# Running the finished job again does no work: it loads the last checkpoint and reports
# the same summary.

# %%
before = json.loads(open(f"{WORKDIR}/summary.json").read())
train(STEPS)
after = json.loads(open(f"{WORKDIR}/summary.json").read())
assert after["final"] == before["final"] and after["rl_steps"] == STEPS
print(f"same summary, still {STEPS} PARL steps: nothing was recomputed")

# %% [markdown]
# Step counts may change on a resume (the model, task and training settings may not: the
# job refuses them with a one-line error). Asking for `MORE` PARL steps continues from the
# checkpoint at step `STEPS`: the warm start is not redone, and the logs hold every step once.

# %%
train(STEPS + MORE)
steps = [r["step"] for r in map(json.loads, open(f"{WORKDIR}/metrics.jsonl")) if r["stage"] == "rl"]
assert steps == list(range(STEPS + MORE)), steps
print(f"PARL steps logged once each: {steps[0]}..{steps[-1]}")
display(Markdown(open(f"{WORKDIR}/summary.md").read()))
display(Image(filename=f"{WORKDIR}/curves.png"))

# %% [markdown]
# ## Next
#
# * `swarmjax eval --config CONFIG --workdir WORKDIR --checkpoint best --sizes 1,16` evaluates
#   a checkpoint on the run's own held-out tasks.
# * `--set FIELD=VALUE` overrides any config field (`swarmjax train --help`).
# * `colab/pieces.ipynb` takes the stack apart: the model and sampler, the GSPO loss, one
#   learner update, and sharding over 8 devices.
