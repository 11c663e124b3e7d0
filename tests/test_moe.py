"""Mixture of experts: expert parallelism over the mesh equals the experts on one device.

(Parity of the layer with transformers' Qwen3-MoE is tests/test_hf.py's ``qwen3_moe``.)"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from swarmjax.models import ModelConfig, init_params
from swarmjax.models.moe import capacity
from swarmjax.models.transformer import forward, param_logical_axes
from swarmjax.optim import OptimConfig, make_optimizer, muon_dimension_numbers
from swarmjax.sampling import Sampler, SamplingConfig, pad_prompts
from swarmjax.sharding.mesh import MeshConfig, make_mesh, tree_shardings

CFG = ModelConfig(num_experts=8, experts_per_token=2, moe_intermediate_size=32, norm_topk_prob=True)


def _loss(params, tokens, cfg, sharding):
    return forward(params, cfg, tokens, activation_sharding=sharding).logits.std()


@pytest.mark.slow
def test_expert_parallel_equals_one_device_and_reports_drops():
    params = init_params(CFG, jax.random.key(0))
    tokens = jnp.asarray(np.random.RandomState(0).randint(0, CFG.vocab_size, (8, 12)))
    ref, ref_grad = jax.value_and_grad(_loss)(params, tokens, CFG, None)
    # (2, 2, 2): experts over fsdp (4 a device), rows over data x fsdp, expert width over tensor
    mesh = make_mesh(MeshConfig(2, 2, 2))
    sharded = jax.device_put(params, tree_shardings(param_logical_axes(CFG), params, mesh))
    assert sharded["layers"]["mlp"]["expert_gate"].sharding.spec == P(None, "fsdp", None, "tensor")
    rows = NamedSharding(mesh, P(("data", "fsdp")))
    step = jax.jit(jax.value_and_grad(_loss), static_argnums=(2, 3))
    value, grad = step(sharded, tokens, CFG.replace(expert_capacity=0), rows)
    assert "all-to-all" in step.lower(sharded, tokens, CFG.replace(expert_capacity=0), rows).compile().as_text()
    np.testing.assert_allclose(value, ref, rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7), grad, ref_grad)
    # 3 rows do not split over the 4 row devices: each expert group shares them out and gathers back
    three = jax.jit(lambda p, t: forward(p, CFG, t, activation_sharding=rows).logits)(sharded, tokens[:3])
    np.testing.assert_allclose(three, forward(params, CFG, tokens[:3]).logits, rtol=1e-4, atol=1e-5)

    # the default capacity (twice the even share) here is the worst case, 24 tokens x 2;
    # on 8 devices, 1000 tokens: 2 x 2000 / 8 slots. A capacity of 1 % drops and says so.
    assert capacity(24, CFG, 2) == 48 and capacity(1000, CFG, 8) == 500
    for cfg, drops in ((CFG, False), (CFG.replace(expert_capacity=0.01), True)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            np.asarray(step(sharded, tokens, cfg, rows)[0])
            jax.effects_barrier()
        said = [str(w.message) for w in caught if "expert capacity" in str(w.message)]
        assert bool(said) == drops, said


@pytest.mark.slow
def test_sampler_on_a_mesh_decodes_a_mixture_of_experts_as_one_device():
    """Greedy decoding on a (2, 2, 2) mesh (the prefill dispatched by all-to-all, the decode
    steps left to XLA) picks the tokens one device picks."""
    params = jax.tree.map(lambda x: x * 8.0 if x.ndim >= 3 else x, init_params(CFG, jax.random.key(2)))
    tokens, mask = pad_prompts([[3, 17, 99, 4, 60], [8, 1, 2], [120], [5, 5]])
    scfg = SamplingConfig(temperature=0.0, max_new_tokens=8)
    ref = Sampler(CFG, scfg)(params, tokens, prompt_mask=mask)
    sampler = Sampler(CFG, scfg, mesh=make_mesh(MeshConfig(2, 2, 2)))
    out = sampler(jax.tree.map(jax.device_put, params, sampler.param_shardings(params)), tokens, prompt_mask=mask)
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    assert len(set(np.asarray(ref.tokens).ravel().tolist())) > 3          # not one repeated id


def test_moe_parameters_counted_and_orthogonalised_per_expert_where_they_are():
    params = init_params(CFG, jax.random.key(0))
    assert sum(x.size for x in jax.tree.leaves(params)) == CFG.num_params()
    dims = muon_dimension_numbers(params)["layers"]["mlp"]
    assert dims["router"] is None                                   # AdamW
    assert dims["expert_gate"].reduction_axis == (2,) and dims["expert_down"].output_axis == (3,)
    # Muon on a mesh: the experts orthogonalised on the devices that hold them, equal to one device
    mesh = make_mesh(MeshConfig(2, 2, 2))
    sharded = jax.device_put(params, tree_shardings(param_logical_axes(CFG), params, mesh))
    grads = jax.tree.map(lambda x: jax.random.normal(jax.random.key(1), x.shape), params)
    cfg = OptimConfig(learning_rate=0.1, max_grad_norm=0.0)
    ref = make_optimizer(cfg).update(grads, make_optimizer(cfg).init(params), params)[0]
    spread = make_optimizer(cfg, mesh=mesh)
    out = jax.jit(spread.update)(grads, spread.init(sharded), sharded)[0]
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), out, ref)
    dense = CFG.replace(num_experts=0)
    assert CFG.matmul_flops_per_token() < dense.replace(intermediate_size=2 * 32 * 2).matmul_flops_per_token()
