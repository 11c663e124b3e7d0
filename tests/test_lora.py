"""LoRA adapters over the frozen base: the forward equals the merged model's, each row of
a batch uses its own adapter (or the bare base), in training and in a cached decode."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from swarmjax.models.config import ModelConfig
from swarmjax.models.lora import LoraConfig, init_lora, merge
from swarmjax.models.transformer import forward, init_cache, init_params

CFG = ModelConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                  intermediate_size=48)
LORA = LoraConfig(rank=4, alpha=8.0)


def _adapters(key, n):
    """``n`` adapters with non-zero B (a fresh one adds nothing)."""
    lora = init_lora(CFG, LORA, key, adapters=n)
    return jax.tree.map(lambda x: x + 0.05 * jax.random.normal(jax.random.fold_in(key, x.size), x.shape), lora)


def test_fresh_adapters_add_nothing_and_trained_ones_equal_the_merged_model():
    params = init_params(CFG, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (2, 7), 0, CFG.vocab_size)
    base = forward(params, CFG, tokens).logits
    fresh = init_lora(CFG, LORA, jax.random.key(2))
    assert fresh["attn"]["q_proj"]["a"].shape == (2, 1, 32, 4)
    assert fresh["attn"]["o_proj"]["b"].shape == (2, 1, 4, 32)
    np.testing.assert_array_equal(forward(params, CFG, tokens, lora=fresh, lora_config=LORA).logits, base)
    lora = _adapters(jax.random.key(3), 1)
    got = forward(params, CFG, tokens, lora=lora, lora_config=LORA).logits
    want = forward(merge(params, lora, LORA.scale), CFG, tokens).logits
    assert float(jnp.abs(got - base).max()) > 1e-2                  # the adapters do something
    np.testing.assert_allclose(got, want, atol=2e-5)


def test_each_row_uses_its_own_adapter_in_training_and_in_a_cached_decode():
    """Rows with adapters 0, 1 and -1 (the bare base) in one batch give what each merged
    model gives alone, for a whole-sequence forward and for a prefill then decode steps."""
    params = init_params(CFG, jax.random.key(0))
    lora = _adapters(jax.random.key(4), 2)
    tokens = jax.random.randint(jax.random.key(5), (3, 9), 0, CFG.vocab_size)
    adapter = jnp.array([1, -1, 0])
    models = {0: merge(params, lora, LORA.scale, index=0), 1: merge(params, lora, LORA.scale, index=1), -1: params}
    want = jnp.stack([forward(models[int(i)], CFG, tokens[b:b + 1]).logits[0] for b, i in enumerate(adapter)])
    got = forward(params, CFG, tokens, lora=lora, lora_config=LORA, adapter=adapter).logits
    np.testing.assert_allclose(got, want, atol=2e-5)
    # prefill 6 ids, then 3 single-id steps through the cache
    cache = init_cache(CFG, 3, 16)
    out = forward(params, CFG, tokens[:, :6], cache=cache, cache_index=0, lora=lora, lora_config=LORA,
                  adapter=adapter)
    steps = [out.logits[:, -1]]
    for t in range(6, 9):
        out = forward(params, CFG, tokens[:, t:t + 1], cache=out.cache, cache_index=t, lora=lora,
                      lora_config=LORA, adapter=adapter, positions=jnp.full((3, 1), t))
        steps.append(out.logits[:, -1])
    np.testing.assert_allclose(jnp.stack(steps[:-1], 1), want[:, 5:8], atol=2e-5)


def test_gradients_reach_only_the_adapters_and_dropout_needs_a_key():
    params = init_params(CFG, jax.random.key(0))
    lora = init_lora(CFG, LORA, jax.random.key(6))
    tokens = jax.random.randint(jax.random.key(7), (2, 5), 0, CFG.vocab_size)

    def loss(lora, key=None, cfg=LORA):
        return forward(params, CFG, tokens, lora=lora, lora_config=cfg, lora_key=key).logits.mean()
    grads = jax.grad(loss)(lora)
    assert jax.tree.structure(grads) == jax.tree.structure(lora)
    assert float(jnp.abs(grads["mlp"]["down_proj"]["b"]).sum()) > 0       # B gets a gradient at once
    drop = dataclasses.replace(LORA, dropout=0.5)
    trained = _adapters(jax.random.key(8), 1)
    assert loss(trained, None, drop) == loss(trained, None, LORA)          # no key: no dropout
    assert loss(trained, jax.random.key(9), drop) != loss(trained, None, drop)


def test_bad_lora_configs_are_one_line_errors():
    with pytest.raises(ValueError, match="rank must be an int >= 1"):
        LoraConfig(rank=0)
    with pytest.raises(ValueError, match="'qkv' matches no module"):
        LoraConfig(targets=("q_proj", "qkv"))
    with pytest.raises(ValueError, match="mixture of experts"):
        LoraConfig(targets=("q_proj", "up_proj")).check(dataclasses.replace(
            CFG, num_experts=4, experts_per_token=2, moe_intermediate_size=16))
    with pytest.raises(ValueError, match="needs lora_config"):
        forward(init_params(CFG, jax.random.key(0)), CFG, jnp.zeros((1, 2), jnp.int32),
                lora=init_lora(CFG, LORA, jax.random.key(1)))
