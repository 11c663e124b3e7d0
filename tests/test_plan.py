"""``swarmjax plan`` and remat: the planned memory of a tiny model agrees with what its
real compile and its real arrays take, remat lowers the planned temporaries and leaves
the gradients unchanged, the Qwen3 presets have the published sizes."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from swarmjax.models import ModelConfig, forward, init_params
from swarmjax.models.config import PRESETS
from swarmjax.models.hf import config_to_hf
from swarmjax.models.remat import remat_policy
from swarmjax.rl.trajectory import TrajectoryBatch
from swarmjax.rl.update import Learner, UpdateConfig
from jax.sharding import PartitionSpec

from swarmjax.sharding.mesh import MeshConfig, make_mesh, rows_sharding
from swarmjax.train.plan import DEVICE_MEMORY, plan_memory, plan_update

CFG = ModelConfig(vocab_size=256, hidden_size=64, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=16,
                  intermediate_size=192)


@pytest.fixture(scope="module")
def mesh():
    return make_mesh(MeshConfig(data=2, fsdp=4, tensor=1), devices=jax.devices()[:8])


@pytest.mark.slow
def test_remat_lowers_the_planned_temporaries(mesh):
    plans = {r: plan_memory(CFG, mesh, batch=16, seq=128, update=UpdateConfig(remat=r)) for r in ("none", "block")}
    assert plans["block"].temp < 0.7 * plans["none"].temp, {r: p.temp for r, p in plans.items()}
    assert plans["block"].params == plans["none"].params > 0
    assert plans["block"].total <= plans["none"].total
    assert all(plans["none"].as_dict()["fits"][d] for d in DEVICE_MEMORY)


@pytest.mark.slow
def test_the_plan_agrees_with_the_real_compile_and_arrays(mesh):
    """Params and optimizer state per device equal the bytes the real sharded arrays
    hold on one device; XLA's memory analysis of the real update equals the plan's."""
    update = UpdateConfig(num_minibatches=2)
    plan = plan_memory(CFG, mesh, batch=8, seq=64, update=update)
    learner = Learner(CFG, update, mesh=mesh)
    state = learner.init(init_params(CFG, jax.random.key(0)))
    on_device0 = lambda tree: sum(s.data.nbytes for x in jax.tree.leaves(tree) for s in x.addressable_shards
                                  if s.device == jax.devices()[0])
    assert plan.params == on_device0(state.params)
    assert plan.opt_state == on_device0(state.opt_state)
    rng = np.random.default_rng(0)
    batch = TrajectoryBatch(tokens=jnp.asarray(rng.integers(0, 256, (8, 64)), jnp.int32),
                            token_mask=jnp.ones((8, 64), bool), loss_mask=jnp.ones((8, 64), bool).at[:, 0].set(False),
                            sampler_logprobs=jnp.zeros((8, 64)), advantages=jnp.ones((8,)),
                            group_ids=jnp.zeros((8,), jnp.int32), rewards=jnp.ones((8,)))
    meshed = jax.device_get(learner.update(state, batch))          # compiles the real update
    real = learner._update[(8, None)].lower(learner.init(init_params(CFG, jax.random.key(1))), batch, None).compile()
    planned, _ = plan_update(learner, 8, 64)
    for field in ("temp_size_in_bytes", "argument_size_in_bytes", "output_size_in_bytes"):
        assert getattr(real.memory_analysis(), field) == getattr(planned.memory_analysis(), field), field
    # a minibatch of 4 rows on the 8 devices of the data axes: its positions are split
    # instead (rows_sharding), and the update equals the single-device one
    assert rows_sharding(mesh, (4, 64)).spec == PartitionSpec(None, ("data", "fsdp"))
    assert rows_sharding(mesh, (8, 64)).spec == PartitionSpec(("data", "fsdp"), None)
    alone = Learner(CFG, update)
    single = jax.device_get(alone.update(alone.init(init_params(CFG, jax.random.key(0))), batch))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5), meshed, single)


def test_the_warm_start_plan_is_its_step_and_splits_its_rows(mesh):
    """The planned warm-start step is the job's (XLA's memory analysis of the real
    ``sft_step`` on placed arrays equals the plan's), and over 8 devices its rows and their
    [B, T, V] log-probs split: the devices together hold at most 1.5x what one device
    does (the 8 simulated devices of one process: a 151k-id warm start was killed for
    memory on them while it fit on one)."""
    from swarmjax.optim import OptimConfig
    from swarmjax.sharding.mesh import batch_sharding
    from swarmjax.train.plan import plan_warm_start, xla_total
    from swarmjax.train.sft import sft_step

    cfg = CFG.replace(vocab_size=8192)
    planned = plan_warm_start(cfg, mesh, 8, 64)
    params, opt_state, step = sft_step(init_params(cfg, jax.random.key(0)), cfg, OptimConfig(),
                                       roles=("r0",), mesh=mesh)
    rows = batch_sharding(mesh, 2, batch_size=8)
    batch = tuple(jax.device_put(jnp.ones((8, 64), dt), rows) for dt in (jnp.int32, bool, bool))
    real = step.lower(params, opt_state, batch).compile()
    for field in ("temp_size_in_bytes", "argument_size_in_bytes", "output_size_in_bytes"):
        assert getattr(real.memory_analysis(), field) == getattr(planned.memory_analysis(), field), field
    one = make_mesh(MeshConfig(), devices=jax.devices()[:1])
    (alone, alone_temp), (each, each_temp) = (xla_total(plan_warm_start(cfg, m, 8, 64)) for m in (one, mesh))
    assert 8 * each <= 1.5 * alone and each_temp < alone_temp / 4, (alone, each)


def test_remat_keeps_values_and_gradients():
    params = init_params(CFG, jax.random.key(0))
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, (2, 16)), jnp.int32)

    def loss(p, remat):
        return jnp.mean(forward(p, CFG, tokens, remat=remat).logits ** 2)
    grad = jax.jit(jax.grad(loss), static_argnums=1)
    ref = grad(params, "none")
    for name in ("block", "dots", "dots_with_no_batch_dims_saveable"):
        got = grad(params, name)
        for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(got)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="unknown remat policy"):
        remat_policy("blocks")
    with pytest.raises(ValueError, match="unknown remat policy"):
        UpdateConfig(remat="nope")


def test_qwen3_presets_have_the_published_sizes():
    sizes = {k: PRESETS[k].num_params() / 1e9 for k in ("qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b")}
    # Qwen3 model cards: 0.6B (0.44B non-embedding), 1.7B, 4.0B, 8.2B parameters
    assert [round(v, 1) for v in sizes.values()] == [0.6, 1.7, 4.0, 8.2], sizes


@pytest.mark.slow
def test_plan_command_prints_json_per_device(tmp_path):
    """The command in its own process (it asks JAX for as many CPU devices as the mesh has),
    on a checkpoint directory's config.json (a preset's shape: 4 bytes a param, a quarter
    per device)."""
    from small_job import subprocess_xla_flags
    env = {**os.environ, "XLA_FLAGS": subprocess_xla_flags()}     # the suite's compiler flags, no device count
    (tmp_path / "config.json").write_text(json.dumps(config_to_hf(PRESETS["1m"])))
    tail = ["--mesh", "1,4,1", "--batch", "8", "--seq", "64", "--remat", "block", "--judge-batch", "8",
            "--judge-prompt", "48", "--judge-model", "tiny", "--warm-batch", "8", "--json"]
    cmd = [sys.executable, "-m", "swarmjax.cli", "plan", "--hf", str(tmp_path), *tail]
    swarm = ["--subagents", "2", "--subagent-context", "32", "--buffers", "2"]
    out = subprocess.run(cmd + swarm, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    plan = json.loads(out.stdout.strip().splitlines()[-1])
    assert {"params", "opt_state", "temp", "total", "kv_cache", "fits"} <= set(plan)
    assert plan["mesh"] == [1, 4, 1] and plan["devices"] == 4 and plan["model"] == str(tmp_path)
    assert 0 < plan["params"] < plan["total"]
    assert abs(plan["params"] - PRESETS["1m"].num_params() * 4 / 4) < 0.05 * plan["params"]
    # an LLM judge of another model: its weights resident throughout, its forward planned
    assert abs(plan["frozen"] - PRESETS["tiny"].num_params() * 4 / 4) < 0.1 * plan["frozen"]
    assert 0 < plan["judge_temp"] < plan["judge_total"] <= plan["total"]
    # the swarm rollout: 8 orchestrator rows of 64 slots, 16 sub-agent rows of 32 (as many
    # cache bytes), a frozen copy of the policy, the optimizer state and judge resident
    sw = plan["swarm"]
    assert plan["subagents"] == 2 and sw["sub_rows"] == 16 and sw["sub_cache"] == sw["orch_cache"] > 0
    assert sw["sub_params"] == plan["params"] and sw["resident"] == plan["opt_state"] + plan["frozen"]
    assert 0 < sw["tick_temp"] and sw["total"] <= plan["total"]
    # each program's two largest arrays: (bytes, "dtype[shape] op", the JAX op), largest first
    assert set(plan["largest"]) == {"update", "rollout", "judge", "warm start"}
    # the warm start's step (one role of 8 rows): its own optimizer state, not donated
    assert plan["params"] + plan["opt_state"] < plan["warm_start_total"] <= plan["total"]
    (big, array, _), (small, _, _) = plan["largest"]["update"]
    assert big >= small > 0 and "[" in array
    # several meshes: a plan each, then the fewest devices of each chip kind that hold the job
    two = subprocess.run(cmd[:4] + ["--model", "1m", "--mesh", "1,1,1", "--mesh", "1,2,1", "--batch", "4",
                                    "--seq", "16"], env=env, capture_output=True, text=True, timeout=300)
    assert two.returncode == 0, two.stderr[-2000:]
    assert two.stdout.count("per device of") == 2 and "fewest devices" in two.stdout
    assert two.stdout.strip().splitlines()[-1].split()[-4:] == ["1", "1", "1", "1"]      # 1m fits one chip of each
    assert "1m @2" in two.stdout                                   # the summary names each mesh's plans
    bad = subprocess.run(cmd[:4] + ["--model", "1m", *tail[:-9], "--remat", "blocks"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "unknown remat policy" in bad.stderr


def test_remat_and_logit_chunks_leave_the_update_unchanged():
    """The memory options change no result: a learner step with remat and log-probs in
    chunks of 5 positions gives the params and metrics of the plain step."""
    rng = np.random.default_rng(0)
    batch = TrajectoryBatch(tokens=jnp.asarray(rng.integers(0, 256, (4, 24)), jnp.int32),
                            token_mask=jnp.ones((4, 24), bool), loss_mask=jnp.ones((4, 24), bool).at[:, 0].set(False),
                            sampler_logprobs=jnp.full((4, 24), -5.0), advantages=jnp.asarray([1.0, -1.0, 0.5, -0.5]),
                            group_ids=jnp.zeros((4,), jnp.int32), rewards=jnp.ones((4,)))
    out = {}
    for name, update in {"plain": UpdateConfig(num_minibatches=2, logits_chunk=0, remat="none"),
                         "memory": UpdateConfig(num_minibatches=2, logits_chunk=5, remat="block")}.items():
        learner = Learner(CFG, update)
        out[name] = learner.update(learner.init(init_params(CFG, jax.random.key(0))), batch)
    for a, b in zip(jax.tree.leaves(out["plain"][0].params), jax.tree.leaves(out["memory"][0].params)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    for k, v in out["plain"][1].items():
        np.testing.assert_allclose(out["memory"][1][k], v, rtol=1e-4, atol=1e-6, err_msg=k)


@pytest.mark.slow
def test_muon_orthogonalises_spread_over_the_mesh(mesh):
    """Muon given the mesh plans far fewer temporaries than the same Muon left to XLA,
    which gathers every layer's float32 matrices on every device for Newton-Schulz."""
    from swarmjax.optim import make_optimizer
    from swarmjax.train.plan import xla_total

    cfg = CFG.replace(hidden_size=256, num_layers=8, head_dim=64, intermediate_size=1024)
    fsdp = make_mesh(MeshConfig(data=1, fsdp=8, tensor=1), devices=jax.devices()[:8])
    update = UpdateConfig(num_minibatches=1)
    temp = {}
    for name, opt in (("spread", None), ("gathered", make_optimizer(update.optim))):
        compiled, _ = plan_update(Learner(cfg, update, mesh=fsdp, optimizer=opt), 8, 16)
        temp[name] = xla_total(compiled)[1]
    assert temp["spread"] < 0.5 * temp["gathered"], temp


def test_a_lora_plan_keeps_optimizer_state_and_sub_agents_to_the_adapters(mesh):
    """LoRA beside full training of one model: the params plus the adapters, the optimizer
    state of the adapters alone, and frozen sub-agents that hold only their adapters (the
    base weights held once): each equal to what the real sharded arrays hold on a device."""
    from swarmjax.models.config import LoraConfig
    from swarmjax.train.plan_swarm import plan_swarm

    lora = CFG.replace(lora=LoraConfig(rank=4))
    full, low = (plan_memory(c, mesh, batch=8, seq=64) for c in (CFG, lora))
    state = Learner(lora, UpdateConfig(), mesh=mesh).init(init_params(lora, jax.random.key(0)))
    on_device0 = lambda tree: sum(s.data.nbytes for x in jax.tree.leaves(tree) for s in x.addressable_shards
                                  if s.device == jax.devices()[0])
    assert low.params == on_device0(state.params) == full.params + on_device0(state.params["lora"])
    assert low.opt_state == on_device0(state.opt_state) < full.opt_state
    swarm = {c.lora is None: plan_swarm(c, mesh, episodes=8, subagents=2, context=64) for c in (CFG, lora)}
    assert swarm[True].sub_params == full.params                        # a second copy of the base
    assert swarm[False].sub_params == on_device0(state.params["lora"])   # the adapters alone


def test_the_smallest_slice_of_each_chip_is_the_fewest_devices_that_fit():
    """``format_slices`` over plans of one job on several meshes: per (model, K), the fewest
    planned devices each chip kind holds it on, and "none" when no planned mesh does."""
    from swarmjax.train.plan import DEVICE_MEMORY, GIB, format_slices, smallest_slices

    def rec(model, devices, gib):
        return {"model": model, "subagents": 8, "devices": devices, "mesh": [1, devices, 1], "total": int(gib * GIB),
                "fits": {chip: gib * GIB <= 0.9 * mem for chip, mem in DEVICE_MEMORY.items()}}
    records = [rec("full", 4, 120.0), rec("full", 8, 60.0), rec("full", 16, 30.0),
               rec("lora", 4, 40.0), rec("lora", 8, 20.0), rec("lora", 16, 10.0)]
    best = smallest_slices(records)
    assert best["full", 8] == {"v5e": None, "v5p": 8, "v6e": None, "h100": 8}
    assert best["lora", 8] == {"v5e": 16, "v5p": 4, "v6e": 8, "h100": 4}
    table = format_slices(records).splitlines()
    assert table[1].split()[2:5] == ["1x4x1", "1x8x1", "1x16x1"]
    assert table[-2].split() == ["full", "8", "120.00", "60.00", "30.00", "none", "8", "none", "8"]
    assert table[-1].split() == ["lora", "8", "40.00", "20.00", "10.00", "16", "4", "8", "4"]


def test_fit_advice_names_the_program_over_the_line_and_what_shrinks_it():
    from swarmjax.train.plan import GIB, MemoryPlan, fit_advice

    plan = MemoryPlan(params=GIB, opt_state=2 * GIB, frozen=0, temp=10 * GIB, update_total=20 * GIB, kv_cache=GIB,
                      rollout_temp=GIB, rollout_total=5 * GIB, devices=1, mesh=(1, 1, 1),
                      warm_start_temp=40 * GIB, warm_start_total=53 * GIB)
    assert fit_advice(plan, "h100") == []                                      # 53 <= 0.9 x 80
    warm, = fit_advice(plan, "v6e")                                            # 0.9 x 32 = 28.8: the warm start only
    assert warm.startswith("does not fit v6e (32 GiB, 90%): the warm start needs 53.00 GiB a device, 24.20 over")
    assert "a smaller --warm-batch (sft.batch)" in warm
    warm, update = fit_advice(plan, "v5e")                                     # 14.4: both, the larger first
    assert "warm start" in warm and update.startswith("does not fit v5e (16 GiB, 90%): the update needs 20.00 GiB")
    assert "--remat block (rl.update.remat)" in update
