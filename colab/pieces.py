# %% [markdown]
# *To open in Colab:* upload this notebook (*File > Upload notebook*) and a clone of the
# repository unzipped in `/content/swarmjax`, or open it from your fork on GitHub
# (`python colab/sync.py --org OWNER` puts an Open-in-Colab badge for it here).
#
# # swarmjax pieces: model, sampler, GSPO, the learner, sharding
#
# `colab/quickstart.ipynb` runs the whole job with one command. This notebook uses the
# pieces it is built from, each on its own: the Qwen3-style policy network and its jitted
# sampler, the GSPO loss, one learner update on a batch of toy trajectories (then a short
# RL loop that learns a toy reward), and the same update sharded over 8 devices.
#
# **Runtime.** *Runtime > Change runtime type > TPU*, GPU or CPU. The sharding section
# uses 8 devices: a TPU with 8 cores (v2-8) uses its own; on a runtime with fewer devices
# it uses 8 simulated CPU devices instead (the flag below, set before jax is imported),
# which run the same sharded programs.
#
# The notebook's source is `colab/pieces.py` in the repository (a jupytext percent file);
# `python colab/sync.py` regenerates this `.ipynb` from it.

# %% [markdown]
# ## 1. Install
#
# The same cell as the quickstart's: keeps Colab's `jax` unless it is older than swarmjax
# requires, installs nothing inside a checkout that already has swarmjax. First, 8 simulated
# CPU devices: XLA reads the flag when jax starts, so it must be set before `import jax`
# (it adds CPU devices beside a TPU or GPU, which stays the default backend).

# %%
import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "").replace(
    "--xla_force_host_platform_device_count=8", "") + " --xla_force_host_platform_device_count=8").strip()

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
# ## 2. The backend

# %%
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

BACKEND = jax.default_backend()
KIND = {"tpu": "TPU", "gpu": "GPU", "cuda": "GPU", "rocm": "GPU", "cpu": "CPU"}.get(BACKEND, BACKEND)
print(f"jax {jax.__version__}: backend {BACKEND!r} ({KIND}), {jax.device_count()} device(s): "
      f"{jax.devices()[0].device_kind}; {len(jax.devices('cpu'))} CPU device(s)")

# %% [markdown]
# ## 3. The model
#
# A Qwen3 decoder (RMSNorm, grouped-query attention, q/k RMSNorm, RoPE, SwiGLU) written as
# pure functions over a plain parameter pytree: `init_params(cfg, key)` and
# `forward(params, cfg, tokens)`. Layer weights are stacked `[L, ...]` and run by
# `lax.scan`. `ModelConfig` is a frozen dataclass (presets: `tiny`, `1m`, `30m`, Qwen3
# 0.6B-8B shapes); `swarmjax.models.hf.from_hf(dir)` loads real Qwen3 / Llama weights.

# %%
from swarmjax.models import forward, init_params, preset  # noqa: E402

cfg = preset("tiny")                      # vocabulary 256, width 64, 2 layers, 4 heads
params = init_params(cfg, jax.random.key(0))
print(cfg)
print(f"{sum(x.size for x in jax.tree.leaves(params)):,} parameters")
print(jax.tree.map(lambda x: x.shape, params["layers"]["attn"]))
logits = jax.jit(forward, static_argnums=1)(params, cfg, jnp.ones((2, 8), jnp.int32)).logits
print("logits", logits.shape)                                           # [B, T, V]

# %% [markdown]
# ## 4. The sampler
#
# Prefill, then a `lax.while_loop` decode over a KV cache, all in one `jax.jit`; greedy,
# temperature, top-k, top-p; ragged (left-padded) prompts; rows stop on their own. It
# returns the sampled ids and, per id, the sampler's log-prob (what RL's importance ratios
# need), the plain temperature-1 log-prob, a mask and each row's length.

# %%
from swarmjax.sampling import Sampler, SamplingConfig, pad_prompts  # noqa: E402

prompts, prompt_mask = pad_prompts([[1, 2, 3], [4], [5, 6]])        # left-padded [B, P]
sampler = Sampler(cfg, SamplingConfig(temperature=0.7, top_p=0.9, max_new_tokens=12))
s = sampler(params, prompts, prompt_mask=prompt_mask, key=jax.random.key(1))
print("tokens\n", s.tokens)                                            # [B, N]
print("sampler log-probs\n", np.round(s.logprobs, 2))
print("lengths", s.lengths)

# %% [markdown]
# ## 5. A toy batch and the GSPO loss
#
# RL needs G samples per prompt and a reward per sample. The toy task: 4 prompts, G = 8
# samples each, reward = the fraction of sampled ids in the lower half of the vocabulary.
# Advantages are group-normalised (GRPO's `(r - mean_g) / std_g`). A `TrajectoryBatch` holds
# the full sequences (prompt + sample), which tokens are real, which are the policy's own
# (the loss mask: here the sampled ones), the sampler's log-probs and the advantages: token
# in, token out, nothing is re-tokenised.

# %%
from swarmjax.rl.advantages import grpo_advantages  # noqa: E402
from swarmjax.rl.trajectory import TrajectoryBatch  # noqa: E402

P, G, N = 4, 8, 12
rl_sampler = Sampler(cfg, SamplingConfig(temperature=1.0, max_new_tokens=N))   # plain sampling
prompt_ids = np.random.RandomState(0).randint(1, cfg.vocab_size, (P, 4))
group_ids = np.repeat(np.arange(P), G)                                 # row i answers prompt i // G


def reward_fn(tokens, mask):
    return jnp.sum((tokens < cfg.vocab_size // 2) * mask, axis=1) / jnp.maximum(jnp.sum(mask, axis=1), 1)


@jax.jit
def to_batch(rows, tokens, token_mask, logprobs):
    """Prompts [B, 4] and samples [B, N] -> (TrajectoryBatch, rewards [B])."""
    rewards = reward_fn(tokens, token_mask)
    batch = TrajectoryBatch.create(
        jnp.concatenate([rows, tokens], axis=1),
        jnp.concatenate([jnp.zeros_like(rows, bool), token_mask], axis=1),          # loss on sampled ids
        grpo_advantages(rewards, jnp.asarray(group_ids)),
        token_mask=jnp.concatenate([jnp.ones_like(rows, bool), token_mask], axis=1),
        sampler_logprobs=jnp.concatenate([jnp.zeros(rows.shape), logprobs], axis=1),
        group_ids=group_ids, rewards=rewards)
    return batch, rewards


def rollout(params, key):
    """G samples per prompt -> (TrajectoryBatch, rewards)."""
    rows = jnp.asarray(prompt_ids[group_ids])                          # [P * G, 4]
    s = rl_sampler(params, rows, key=key)
    return to_batch(rows, s.tokens, s.token_mask, s.logprobs)


batch, rewards = rollout(params, jax.random.key(2))
print("tokens", batch.tokens.shape, "reward mean", float(rewards.mean()))
print("advantages", np.round(batch.advantages, 2))

# %% [markdown]
# GSPO (`loss_preset("gspo")`) clips the *sequence-level* importance ratio
# `s_i = exp(mean_t log(pi_theta / pi_old))` to `[1 - 3e-4, 1 + 4e-4]`. `policy_loss` takes
# per-token log-probs `[B, T]` of the current and the old policy, the advantages and the loss
# mask, and returns `-J` and metrics. At `pi_theta = pi_old` every ratio is 1 and nothing is
# clipped; the gradient of the loss is the policy gradient.

# %%
from swarmjax.rl.losses import loss_preset, policy_loss, token_logprobs  # noqa: E402

gspo = loss_preset("gspo")
print(gspo)


def logprobs(p, batch):
    return token_logprobs(forward(p, cfg, batch.tokens, token_mask=batch.token_mask).logits, batch.tokens)


def loss_fn(p, old_logp, batch):
    return policy_loss(logprobs(p, batch), old_logp, batch.advantages, batch.loss_mask, gspo)


old_logp = jax.jit(logprobs)(params, batch)                            # pi_old: the sampling params
(loss, metrics), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(params, old_logp, batch)
print(f"loss {float(loss):.4f}", {k: round(float(v), 4) for k, v in metrics.items()})
print("gradient norm", float(jnp.sqrt(sum(jnp.sum(g ** 2) for g in jax.tree.leaves(grads)))))

# %% [markdown]
# ## 6. `Learner.update`
#
# One jitted call per rollout batch: the old log-probs, then several minibatch steps
# (`lax.scan`; optional microbatch gradient accumulation), Muon for the stacked attention /
# MLP matrices and AdamW for the rest, QK-Clip after each step, non-finite steps skipped and
# counted. Its input state is donated, so the learner gets a copy of the params.

# %%
from swarmjax.optim import OptimConfig  # noqa: E402
from swarmjax.rl.update import Learner, UpdateConfig  # noqa: E402

ucfg = UpdateConfig(loss=loss_preset("gspo"), optim=OptimConfig(learning_rate=3e-3), num_minibatches=2)
learner = Learner(cfg, ucfg)
state = learner.init(jax.tree.map(jnp.copy, params))
state, metrics = learner.update(state, batch)
print("optimizer steps", int(state.step))
print({k: round(float(v), 4) for k, v in metrics.items()})

# %% [markdown]
# A short RL loop with these two pieces: sample, reward, update (both compiled by now, so
# each iteration takes milliseconds). The mean reward climbs from about 0.5 (a random
# model's ids fall in the lower half of the vocabulary half of the time).

# %%
history = []
for i in range(30):
    batch_i, rewards_i = rollout(state.params, jax.random.fold_in(jax.random.key(3), i))
    state, m = learner.update(state, batch_i)
    history.append(float(rewards_i.mean()))
    if i % 5 == 4:
        print(f"iteration {i:2d}: reward {history[-1]:.3f}, clip fraction {float(m['clip_fraction']):.2f}")
print(f"mean reward: first 5 iterations {np.mean(history[:5]):.3f}, last 5 {np.mean(history[-5:]):.3f}")

# %%
import matplotlib.pyplot as plt  # noqa: E402

plt.figure(figsize=(5, 3))
plt.plot(history, marker="o")
plt.xlabel("iteration")
plt.ylabel("mean reward")
plt.title("toy RL: GSPO + Muon")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 7. Sharding over 8 devices
#
# `make_mesh(MeshConfig(data, fsdp, tensor))` builds a `(data, fsdp, tensor)` mesh (`-1`:
# the rest of the devices). One table of logical-axis rules maps every parameter and
# activation onto it (a dimension that does not divide is replicated), and the learner and
# the sampler place their inputs with `NamedSharding`s and compile for that mesh. Here a
# 1 x 4 x 2 mesh: the batch split 4 ways over `data` x `fsdp` (FSDP is data parallelism
# with the weights and optimizer state sharded too), the weights over `fsdp` and `tensor`
# (attention heads, MLP columns, vocabulary).

# %%
from swarmjax.sharding import MeshConfig, make_mesh  # noqa: E402

devices = jax.devices() if jax.device_count() >= 8 else jax.devices("cpu")
assert len(devices) >= 8, "no 8 devices: set XLA_FLAGS before importing jax (first cell)"
mesh = make_mesh(MeshConfig(data=1, fsdp=4, tensor=2), devices[:8])
print(dict(mesh.shape), "on", len(mesh.devices.flat), devices[0].platform.upper(), "devices")

# the update of section 6 again, on the mesh, from the same params and batch; as host
# (numpy) copies, which each jitted call places itself: the mesh may be on another backend
# than `params` (8 simulated CPU devices beside a 1-chip TPU)
host_params, host_batch = jax.device_get((params, batch))
sharded = Learner(cfg, ucfg, mesh=mesh)
state8 = sharded.init(host_params)
q = state8.params["layers"]["attn"]["q_proj"]
print("q_proj", q.shape, "spec", q.sharding.spec, "-> per-device shard", q.sharding.shard_shape(q.shape))
state8, metrics8 = sharded.update(state8, host_batch)
# the 1-device reference on the mesh's platform (a TPU rounds float32 matmuls unlike a CPU)
one = devices[0]
state1, metrics1 = learner.update(learner.init(jax.device_put(host_params, one)), jax.device_put(host_batch, one))
diff = max(float(np.max(np.abs(a - b))) for a, b in
           zip(jax.tree.leaves(jax.device_get(state8.params)), jax.tree.leaves(jax.device_get(state1.params))))
print(f"loss on 8 devices {float(metrics8['loss']):.6f}, on 1 {float(metrics1['loss']):.6f}; "
      f"largest parameter difference {diff:.1e}")
assert diff < 1e-4

# %% [markdown]
# The sampler over the same mesh: weights and KV cache sharded by the same rules, the batch
# over the data axes; with greedy decoding it returns the same ids as on one device.

# %%
greedy = SamplingConfig(temperature=0.0, max_new_tokens=12)
rows = prompt_ids[group_ids]                                            # [32, 4], numpy
ids8 = Sampler(cfg, greedy, mesh=mesh)(host_params, rows, key=jax.random.key(4)).tokens
ids1 = Sampler(cfg, greedy)(jax.device_put(host_params, one), jax.device_put(rows, one), key=jax.random.key(4)).tokens
same = bool((np.asarray(ids8) == np.asarray(ids1)).all())
print("output sharding", ids8.sharding.spec, "- same ids as on one device:", same)
assert same

# %% [markdown]
# ## Next
#
# * The swarm rollout engine (`swarmjax.swarm.engine.SwarmRollout`) runs a batch of
#   orchestrator + sub-agent episodes in one `jax.jit`; `swarmjax.train.parl.PARLTrainer`
#   puts it together with this learner. README.md shows both on their own.
# * `swarmjax plan` estimates the per-device memory of the update and the rollout on a mesh
#   for real model sizes before you rent one.
