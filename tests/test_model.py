"""The decoder against an independent NumPy implementation written from the Qwen3 formulas."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from swarmjax.models import ModelConfig, init_cache, init_params, param_logical_axes
from swarmjax.models.transformer import abstract_params, forward_jit, rope_table


def _rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _rope(x, pos, theta):  # x [T, N, hd]
    hd = x.shape[-1]
    inv = 1.0 / theta ** (np.arange(0, hd, 2) / hd)
    ang = pos[:, None] * inv[None]                       # [T, hd/2]
    cos, sin = np.cos(ang)[:, None], np.sin(ang)[:, None]
    x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def numpy_forward(p, cfg, tokens):
    """One sequence [T] -> logits [T, V], max pre-softmax logit [L, H]."""
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), p)
    T = len(tokens)
    pos = np.arange(T, dtype=np.float64)
    x = p["embed"][tokens]
    maxes = []
    for l in range(cfg.num_layers):
        lp = jax.tree.map(lambda a: a[l], p["layers"])
        a = lp["attn"]
        h = _rms(x, lp["input_norm"]["scale"], cfg.rms_norm_eps)
        q = np.einsum("td,dhk->thk", h, a["q_proj"])
        k = np.einsum("td,dhk->thk", h, a["k_proj"])
        v = np.einsum("td,dhk->thk", h, a["v_proj"])
        q = _rope(_rms(q, a["q_norm"]["scale"], cfg.rms_norm_eps), pos, cfg.rope_theta)
        k = _rope(_rms(k, a["k_norm"]["scale"], cfg.rms_norm_eps), pos, cfg.rope_theta)
        outs, mx = [], []
        for head in range(cfg.num_heads):
            kv = head // cfg.num_groups
            s = q[:, head] @ k[:, kv].T / np.sqrt(cfg.head_dim)     # [T, T]
            s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
            mx.append(s.max())
            w = np.exp(s - s.max(-1, keepdims=True))
            outs.append((w / w.sum(-1, keepdims=True)) @ v[:, kv])
        maxes.append(mx)
        x = x + np.einsum("thk,hkd->td", np.stack(outs, 1), a["o_proj"])
        h = _rms(x, lp["post_attn_norm"]["scale"], cfg.rms_norm_eps)
        m = lp["mlp"]
        g = h @ m["gate_proj"]
        x = x + (g / (1 + np.exp(-g)) * (h @ m["up_proj"])) @ m["down_proj"]
    x = _rms(x, p["final_norm"]["scale"], cfg.rms_norm_eps)
    return x @ p["lm_head"], np.array(maxes)


def test_forward_matches_numpy_reference(tiny_cfg, tiny_params, rng):
    tokens = rng.randint(0, tiny_cfg.vocab_size, (2, 11))
    out = forward_jit(tiny_params, tiny_cfg, jnp.asarray(tokens), return_max_logits=True)
    assert out.logits.shape == (2, 11, tiny_cfg.vocab_size) and out.logits.dtype == jnp.float32
    ref_maxes = []
    for b in range(2):
        ref_logits, ref_max = numpy_forward(tiny_params, tiny_cfg, tokens[b])
        np.testing.assert_allclose(out.logits[b], ref_logits, atol=2e-4, rtol=1e-4)
        ref_maxes.append(ref_max)
    # max over the batch, per layer and head
    np.testing.assert_allclose(out.max_logits, np.max(ref_maxes, axis=0), atol=1e-4, rtol=1e-4)
    assert out.max_logits.shape == (tiny_cfg.num_layers, tiny_cfg.num_heads)


def test_long_rows_attend_by_causal_blocks_with_the_same_outputs(tiny_cfg, tiny_params, rng, monkeypatch):
    """Rows of 2 attention blocks or more attend a block of queries at a time over the keys
    up to the block's end (no cache: training, scoring, prefills): logits, max logits and
    the prefill's cache as one whole-row softmax gives them, with padding and an uneven
    last block."""
    from swarmjax.models import attention, transformer

    monkeypatch.setattr(attention, "ATTENTION_BLOCK", 4)
    tokens = jnp.asarray(rng.randint(0, tiny_cfg.vocab_size, (2, 11)))
    mask = jnp.asarray(np.arange(11)[None] < np.array([[11], [7]]))          # the second row right-padded
    blocked = transformer.forward(tiny_params, tiny_cfg, tokens, token_mask=mask, return_max_logits=True)
    cache = transformer.forward(tiny_params, tiny_cfg, tokens, token_mask=mask, cache=init_cache(tiny_cfg, 2, 12),
                                cache_index=0).cache
    monkeypatch.setattr(attention, "ATTENTION_BLOCK", 64)                   # one whole-row softmax
    whole = transformer.forward(tiny_params, tiny_cfg, tokens, token_mask=mask, return_max_logits=True)
    ref_cache = transformer.forward(tiny_params, tiny_cfg, tokens, token_mask=mask,
                                    cache=init_cache(tiny_cfg, 2, 12), cache_index=0).cache
    # float32 rounding of another reduction order, relative to values up to ~10 (the later
    # layers' keys and values carry the earlier layers' attention): rtol as well as atol
    tol = dict(rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(blocked.logits[0], whole.logits[0], **tol)
    np.testing.assert_allclose(blocked.logits[1, :7], whole.logits[1, :7], **tol)
    np.testing.assert_allclose(blocked.max_logits, whole.max_logits, **tol)
    for a, b in zip(jax.tree.leaves(cache), jax.tree.leaves(ref_cache)):
        np.testing.assert_allclose(a, b, **tol)


def test_max_logits_not_computed_unless_requested(tiny_cfg, tiny_params):
    tokens = jnp.zeros((1, 4), jnp.int32)
    assert forward_jit(tiny_params, tiny_cfg, tokens).max_logits is None
    hlo = jax.jit(lambda p, t: forward_jit(p, tiny_cfg, t).logits).lower(tiny_params, tokens).as_text()
    hlo_max = jax.jit(lambda p, t: forward_jit(p, tiny_cfg, t, return_max_logits=True)
                      ).lower(tiny_params, tokens).as_text()
    assert hlo.count("maximum") < hlo_max.count("maximum")


def test_left_padding_does_not_change_real_tokens(tiny_cfg, tiny_params, rng):
    tokens = rng.randint(1, tiny_cfg.vocab_size, (1, 6))
    padded = np.concatenate([np.zeros((1, 3), int), tokens], 1)
    mask = np.concatenate([np.zeros((1, 3), bool), np.ones((1, 6), bool)], 1)
    a = forward_jit(tiny_params, tiny_cfg, jnp.asarray(tokens)).logits
    b = forward_jit(tiny_params, tiny_cfg, jnp.asarray(padded), token_mask=jnp.asarray(mask)).logits
    np.testing.assert_allclose(a, b[:, 3:], atol=5e-5)  # f32: padded softmax sums in another order


def test_cached_chunks_match_full_forward(tiny_cfg, tiny_params, rng):
    tokens = jnp.asarray(rng.randint(0, tiny_cfg.vocab_size, (2, 9)))
    full = forward_jit(tiny_params, tiny_cfg, tokens).logits
    cache = init_cache(tiny_cfg, 2, 12)
    got, start = [], 0
    for size in (4, 1, 3, 1):   # prefill, then single tokens and a chunk
        chunk = tokens[:, start:start + size]
        pos = jnp.broadcast_to(jnp.arange(start, start + size), chunk.shape)
        out = forward_jit(tiny_params, tiny_cfg, chunk, positions=pos, cache=cache, cache_index=start)
        cache, start = out.cache, start + size
        got.append(out.logits)
    np.testing.assert_allclose(jnp.concatenate(got, 1), full, atol=1e-5)
    assert int(cache.valid.sum()) == 2 * 9


def test_logits_to_keep_is_the_tail(tiny_cfg, tiny_params, rng):
    tokens = jnp.asarray(rng.randint(0, tiny_cfg.vocab_size, (2, 9)))
    full = forward_jit(tiny_params, tiny_cfg, tokens).logits
    cache = init_cache(tiny_cfg, 2, 12)
    for out in (forward_jit(tiny_params, tiny_cfg, tokens, logits_to_keep=2),
                forward_jit(tiny_params, tiny_cfg, tokens, cache=cache, logits_to_keep=2)):
        assert out.logits.shape == (2, 2, tiny_cfg.vocab_size)
        np.testing.assert_allclose(out.logits, full[:, -2:], atol=1e-5)


def test_rope_table_lookup_equals_evaluated_rope(tiny_cfg, tiny_params, rng):
    tokens = jnp.asarray(rng.randint(0, tiny_cfg.vocab_size, (2, 9)))
    pos = jnp.asarray(rng.randint(0, 12, (2, 9)))
    want = forward_jit(tiny_params, tiny_cfg, tokens, positions=pos).logits
    table = rope_table(tiny_cfg, 12)
    np.testing.assert_allclose(forward_jit(tiny_params, tiny_cfg, tokens, positions=pos, rope_table=table).logits,
                               want, atol=1e-5)
    short = forward_jit(tiny_params, tiny_cfg, tokens, positions=pos.at[1, 3].set(12), rope_table=table).logits
    assert np.isnan(short[1, 3:]).all() and not np.isnan(short[0]).any()   # past the table: NaN, not clamped


def test_per_row_cache_slots(tiny_cfg, tiny_params, rng):
    """Rows that advance at different rates (a swarm rollout) write their own slot:
    feeding row b's token t at slot t, at any interleaving, gives the full-forward logits."""
    B, T = 3, 6
    tokens = jnp.asarray(rng.randint(0, tiny_cfg.vocab_size, (B, T)))
    full = forward_jit(tiny_params, tiny_cfg, tokens).logits
    cache = init_cache(tiny_cfg, B, T + 1)
    pos = np.zeros(B, np.int32)
    got = np.zeros((B, T, tiny_cfg.vocab_size), np.float32)
    schedule = [[0, 1, 2], [0], [0, 2], [1], [0, 1, 2], [2], [1, 0], [1, 2], [0, 1, 2], [1, 2], [1], [2]]
    for active in schedule:
        emit = np.isin(np.arange(B), active) & (pos < T)
        slot = np.where(emit, pos, T)                       # masked rows use the scratch slot
        tok = tokens[jnp.arange(B), jnp.minimum(pos, T - 1)]
        out = forward_jit(tiny_params, tiny_cfg, tok[:, None], positions=jnp.asarray(pos)[:, None],
                          token_mask=jnp.asarray(emit)[:, None], cache=cache,
                          cache_index=jnp.asarray(slot))
        cache = out.cache
        for b in np.flatnonzero(emit):
            got[b, pos[b]] = np.asarray(out.logits[b, 0])
        pos += emit
    assert np.all(pos == T)
    np.testing.assert_allclose(got, np.asarray(full), atol=2e-5, rtol=2e-5)


def test_param_tree_layout_and_logical_axes(tiny_cfg):
    params = abstract_params(tiny_cfg)
    logical = param_logical_axes(tiny_cfg)
    flat_p = jax.tree_util.tree_leaves_with_path(params)
    flat_l = jax.tree.leaves(logical, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
    assert len(flat_p) == len(flat_l)
    for (path, leaf), spec in zip(flat_p, flat_l):
        assert len(spec) == leaf.ndim, (path, spec)
    # stacked layers, per-head projections (Muon orthogonalises per matrix later)
    assert params["layers"]["attn"]["q_proj"].shape == (2, 32, 4, 8)
    assert logical["layers"]["attn"]["q_proj"] == jax.sharding.PartitionSpec(
        "layers", "embed", "heads", "head_dim")
    assert sum(x.size for x in jax.tree.leaves(params)) == tiny_cfg.num_params()


def test_llama_variant_has_no_qk_norm(tiny_cfg):
    llama = tiny_cfg.replace(qk_norm=False, attention_bias=True)
    attn = abstract_params(llama)["layers"]["attn"]
    assert "q_norm" not in attn and "q_bias" in attn and "o_bias" in attn
    assert sum(x.size for x in jax.tree.leaves(abstract_params(llama))) == llama.num_params()


def test_bfloat16_params_and_compute(tiny_cfg, tiny_params, rng):
    cfg16 = tiny_cfg.replace(param_dtype="bfloat16", dtype="bfloat16")
    p16 = init_params(cfg16, jax.random.key(0))
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(p16))
    tokens = jnp.asarray(rng.randint(0, tiny_cfg.vocab_size, (2, 7)))
    p16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), tiny_params)
    lo = forward_jit(p16, cfg16, tokens).logits
    hi = forward_jit(tiny_params, tiny_cfg, tokens).logits
    assert lo.dtype == jnp.float32
    # bf16 has ~3 significant digits: close, but not equal
    scale = float(jnp.abs(hi).max())
    assert 0 < float(jnp.abs(lo - hi).max()) < 0.1 * scale


@pytest.mark.parametrize("bad", [dict(num_heads=6, num_kv_heads=4), dict(hidden_size=0),
                                 dict(dtype="float64"), dict(rope_type="yarn"),
                                 dict(rope_type="llama3")])
def test_bad_model_config_raises(bad):
    with pytest.raises(ValueError):
        ModelConfig(**bad)


def test_yarn_rope_table_carries_the_attention_factor(tiny_cfg):
    from swarmjax.models.config import YarnScaling
    from swarmjax.models.transformer import rope_attention_factor, rope_inv_freq
    yarn = tiny_cfg.replace(rope_type="yarn", rope_scaling=YarnScaling(factor=4.0, original_max_position_embeddings=16))
    scale = rope_attention_factor(yarn)
    assert scale == pytest.approx(0.1 * np.log(4.0) + 1) and rope_attention_factor(tiny_cfg) == 1.0
    cos, sin = rope_table(yarn, 40)
    np.testing.assert_allclose(cos ** 2 + sin ** 2, scale ** 2, rtol=1e-5)
    inv, plain = rope_inv_freq(yarn), rope_inv_freq(tiny_cfg)
    assert inv[0] == plain[0] and np.allclose(inv[-1], plain[-1] / 4.0)   # fastest kept, slowest interpolated


def test_new_config_fields_stay_out_of_the_repr_at_their_default(tiny_cfg):
    # a saved run's / warm start's identity is repr(model): unchanged for configs that predate o_bias
    assert "o_bias" not in repr(tiny_cfg)
    qwen2 = tiny_cfg.replace(qk_norm=False, attention_bias=True, o_bias=False)
    assert "o_bias=False" in repr(qwen2) and not qwen2.has_o_bias and tiny_cfg.replace(attention_bias=True).has_o_bias


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_dense_backward_is_the_matmul_gradient(dtype, tiny_cfg, tiny_params, monkeypatch):
    """dense (the SwiGLU's projections with their own backward pass) has the
    gradients of ``x @ w``, alone and through the whole model's loss."""
    from swarmjax.models import transformer

    kx, kw, kd = jax.random.split(jax.random.key(3), 3)
    x = jax.random.normal(kx, (3, 5, 8), dtype)
    w = jax.random.normal(kw, (8, 6), dtype)
    dy = jax.random.normal(kd, (3, 5, 6), dtype)
    own = jax.vjp(transformer.dense, x, w)[1](dy)
    plain = jax.vjp(lambda a, b: a @ b, x, w)[1](dy)
    tol = 1e-5 if dtype == jnp.float32 else 3e-2
    for a, b in zip(own, plain):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=tol, atol=tol)

    tokens = jnp.asarray(np.arange(24).reshape(2, 12) % tiny_cfg.vocab_size, jnp.int32)

    def loss(p):
        return jax.nn.log_softmax(transformer.forward(p, tiny_cfg, tokens).logits).mean()

    got = jax.grad(loss)(tiny_params)
    monkeypatch.setattr(transformer, "dense", lambda a, b: a @ b)
    jax.clear_caches()
    want = jax.grad(loss)(tiny_params)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
