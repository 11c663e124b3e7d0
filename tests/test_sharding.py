"""Mesh construction, the logical rule table, and sharded == unsharded forward passes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from swarmjax.models.transformer import forward, param_logical_axes
from swarmjax.sharding import (MeshConfig, batch_sharding, logical_to_spec, make_mesh, shard_tree,
                               tree_shardings)


def test_mesh_config_resolution():
    assert MeshConfig().shape(8) == (8, 1, 1)
    assert MeshConfig(data=2, fsdp=-1, tensor=2).shape(8) == (2, 2, 2)
    assert MeshConfig(1, 1, 1).shape(1) == (1, 1, 1)
    with pytest.raises(ValueError, match="needs 8 devices, but 4"):
        MeshConfig(2, 2, 2).shape(4)
    with pytest.raises(ValueError, match="not a multiple"):
        MeshConfig(data=-1, tensor=3).shape(8)
    with pytest.raises(ValueError, match="at most one"):
        MeshConfig(-1, -1, 1).shape(8)


def test_make_mesh_uses_named_axes():
    mesh = make_mesh(MeshConfig(2, 2, 2))
    assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
    assert len(jax.devices()) == 8


def test_rule_table_with_fallbacks():
    mesh = make_mesh(MeshConfig(2, 1, 4))
    assert logical_to_spec(("embed", "mlp"), (64, 128), mesh) == P(None, "tensor")  # fsdp=1 unused
    assert logical_to_spec(("embed", "kv_heads", "head_dim"), (64, 2, 8), mesh) == P(None, None, None)  # 2 % 4
    assert logical_to_spec(("batch", None), (6, 3), mesh) == P("data", None)
    mesh = make_mesh(MeshConfig(2, 2, 2))
    assert logical_to_spec(("batch", None), (8, 3), mesh) == P(("data", "fsdp"), None)
    # a mesh axis is used once per array: vocab takes tensor, embed takes fsdp
    assert logical_to_spec(("vocab", "embed"), (96, 32), mesh) == P("tensor", "fsdp")
    assert logical_to_spec(("mlp", "heads"), (64, 4), mesh) == P("tensor", None)
    with pytest.raises(KeyError, match="no sharding rule"):
        logical_to_spec(("nonsense",), (4,), mesh)
    assert batch_sharding(mesh, 2, batch_size=3).spec == P(None, None)   # not divisible: replicated


def test_sharded_forward_matches_unsharded(tiny_cfg, tiny_params, rng):
    mesh = make_mesh(MeshConfig(2, 2, 2))
    shardings = tree_shardings(param_logical_axes(tiny_cfg), tiny_params, mesh)
    params = shard_tree(tiny_params, shardings)
    # parameters really are split: q_proj [L, D, H, hd] over fsdp (D) and tensor (H)
    q = params["layers"]["attn"]["q_proj"]
    assert q.sharding.shard_shape(q.shape) == (2, 16, 2, 8)
    tokens = jnp.asarray(rng.randint(0, tiny_cfg.vocab_size, (8, 10)))
    rows = batch_sharding(mesh, 2, batch_size=8)
    fn = jax.jit(lambda p, t: forward(p, tiny_cfg, t, return_max_logits=True),
                 in_shardings=(shardings, rows))
    sharded = fn(params, tokens)
    single = jax.jit(lambda p, t: forward(p, tiny_cfg, t, return_max_logits=True))(
        tiny_params, tokens)
    # float32; sharded matmuls sum in a different order, so allow 1e-4
    np.testing.assert_allclose(sharded.logits, single.logits, atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(sharded.max_logits, single.max_logits, atol=1e-4, rtol=1e-4)
    assert len(sharded.logits.sharding.device_set) == 8
