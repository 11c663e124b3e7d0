"""The jitted KV-cache sampler against a no-cache, token-by-token reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from swarmjax.models.transformer import forward_jit, init_cache
from swarmjax.sampling import Sampler, SamplingConfig, filter_logits, pad_prompts, select_tokens
from swarmjax.sampling.sampler import generate, segment_ends
from swarmjax.sharding import MeshConfig, make_mesh

PROMPTS = [[5, 9, 13, 2], [7], [1, 2, 3, 4, 5, 6], [40, 41]]
N = 8


def reference_decode(params, cfg, prompt, n):
    """No cache: re-run the whole sequence for each new token. Returns tokens and
    the temperature-1 log-prob of each."""
    seq, lps = list(prompt), []
    for _ in range(n):
        # right-pad to one fixed length (one compile); causal attention ignores the tail
        padded = jnp.asarray([seq + [0] * (16 - len(seq))])
        logits = forward_jit(params, cfg, padded).logits[0, len(seq) - 1]
        tok = int(jnp.argmax(logits))
        lps.append(float(jax.nn.log_softmax(logits)[tok]))
        seq.append(tok)
    return seq[len(prompt):], lps


@pytest.fixture(scope="module")
def greedy(tiny_cfg):
    return Sampler(tiny_cfg, SamplingConfig(temperature=0.0, max_new_tokens=N))


@pytest.fixture(scope="module")
def greedy_out(greedy, tiny_params):
    tokens, mask = pad_prompts(PROMPTS)
    return jax.device_get(greedy(tiny_params, tokens, prompt_mask=mask))


def test_cached_greedy_matches_no_cache_reference(tiny_cfg, tiny_params, greedy_out):
    for b, prompt in enumerate(PROMPTS):
        ref, ref_lp = reference_decode(tiny_params, tiny_cfg, prompt, N)
        assert greedy_out.tokens[b].tolist() == ref
        np.testing.assert_allclose(greedy_out.model_logprobs[b], ref_lp, atol=1e-4)
    assert len({tuple(t) for t in greedy_out.tokens.tolist()}) > 1   # not a degenerate model
    assert (greedy_out.logprobs == 0).all()      # greedy samples from a point mass
    assert greedy_out.lengths.tolist() == [N] * 4 and greedy_out.token_mask.all()
    assert greedy_out.done.all()


def test_right_padding_equals_left_padding(greedy, tiny_params, greedy_out):
    P = max(map(len, PROMPTS))
    tokens = np.zeros((4, P), np.int32)
    mask = np.zeros((4, P), bool)
    for b, p in enumerate(PROMPTS):
        tokens[b, :len(p)], mask[b, :len(p)] = p, True
    out = greedy(tiny_params, tokens, prompt_mask=mask)
    np.testing.assert_array_equal(out.tokens, greedy_out.tokens)


def test_stop_tokens_and_per_row_limits(greedy, tiny_params, greedy_out):
    tokens, mask = pad_prompts(PROMPTS)
    stop_at = greedy_out.tokens[1, 2]           # row 1 stops at its 3rd token
    first_hit = int(np.argmax(greedy_out.tokens[1] == stop_at))
    stops = np.full((4, 2), -1, np.int32)
    stops[1, 0] = stop_at
    limits = np.array([3, N, 1, N], np.int32)
    out = jax.device_get(greedy(tiny_params, tokens, prompt_mask=mask, max_new_tokens=limits, stop_tokens=stops))
    assert out.lengths.tolist() == [3, first_hit + 1, 1, N]
    np.testing.assert_array_equal(out.token_mask, np.arange(N)[None] < out.lengths[:, None])
    for b in range(4):
        n = out.lengths[b]
        assert out.tokens[b, :n].tolist() == greedy_out.tokens[b, :n].tolist()
        assert (out.tokens[b, n:] == 0).all() and (out.model_logprobs[b, n:] == 0).all()
    assert out.done.all()


def test_loop_ends_when_every_row_is_done(greedy, tiny_params):
    tokens, mask = pad_prompts(PROMPTS)
    out = greedy(tiny_params, tokens, prompt_mask=mask, max_new_tokens=np.array([1, 2, 1, 1]))
    # the prompt, plus one decode step that fed token 0 of row 1; no more steps ran
    assert int(out.cache.valid.sum()) == sum(map(len, PROMPTS)) + 1
    assert out.lengths.tolist() == [1, 2, 1, 1]


def test_segment_ends():
    assert segment_ends(127, 4) == [32, 64, 96, 127]
    assert segment_ends(2, 4) == [1, 2] and segment_ends(0, 4) == [0] and segment_ends(9, 1) == [9]


def test_decode_segments_equal_one_loop(tiny_cfg, tiny_params):
    """Decoding in segments, each attending over a growing window of the cache, gives
    what one loop over the whole cache gives: tokens, both log-probs, the cache; with
    rows ending inside different segments."""
    n, tokens, mask = 40, *pad_prompts(PROMPTS)          # P = 6: windows of 16, 32, 46 slots
    limits = np.array([5, 15, 40, 25], np.int32)
    outs, texts = [], []
    for segments in (1, 4):
        sampler = Sampler(tiny_cfg, SamplingConfig(temperature=0.8, max_new_tokens=n,
                                                   decode_segments=segments))
        outs.append(jax.device_get(sampler(tiny_params, tokens, prompt_mask=mask, key=jax.random.key(5),
                                          max_new_tokens=limits)))
        texts.append(jax.jit(lambda p, t, m: generate(p, tiny_cfg, sampler.scfg, t, m, jax.random.key(0),
                                                      init_cache(tiny_cfg, 4, 46))).lower(
            tiny_params, tokens, mask).as_text())
    one, seg = outs
    assert "4x2x8x16x" in texts[1] and "4x2x8x16x" not in texts[0]   # a 16-slot key window
    np.testing.assert_array_equal(seg.tokens, one.tokens)
    np.testing.assert_array_equal(seg.lengths, limits)
    np.testing.assert_allclose(seg.logprobs, one.logprobs, atol=1e-5)
    np.testing.assert_allclose(seg.model_logprobs, one.model_logprobs, atol=1e-5)
    np.testing.assert_array_equal(seg.cache.valid, one.cache.valid)
    for a, b in zip(seg.cache.k + seg.cache.v, one.cache.k + one.cache.v):
        np.testing.assert_allclose(a, b, rtol=5e-4, atol=1e-4)   # f32: sums over other window sizes


def test_temperature_top_k_logprobs_are_the_sampling_distribution(tiny_cfg, tiny_params):
    scfg = SamplingConfig(temperature=0.7, top_k=5, max_new_tokens=6)
    tokens, mask = pad_prompts(PROMPTS)
    out = jax.device_get(Sampler(tiny_cfg, scfg)(tiny_params, tokens, prompt_mask=mask, key=jax.random.key(3)))
    for b, prompt in enumerate(PROMPTS):
        seq = list(prompt) + out.tokens[b].tolist()
        logits = forward_jit(tiny_params, tiny_cfg, jnp.asarray([seq])).logits[0]
        for i in range(6):
            raw = logits[len(prompt) - 1 + i]
            tok = out.tokens[b, i]
            filtered = filter_logits(raw[None], scfg)[0]
            assert np.isfinite(filtered[tok])               # sampled inside the top-k
            np.testing.assert_allclose(out.logprobs[b, i], jax.nn.log_softmax(filtered)[tok], atol=1e-4)
            np.testing.assert_allclose(out.model_logprobs[b, i], jax.nn.log_softmax(raw)[tok], atol=1e-4)


def _np_filter(logits, temperature, top_k, top_p):
    x = logits / temperature
    if top_k:
        x = np.where(x >= np.sort(x)[-top_k], x, -np.inf)
    order = np.argsort(-x)
    p = np.exp(x[order] - x[order][0])
    p /= p.sum()
    keep = np.zeros_like(x, bool)
    mass = 0.0
    for i, idx in enumerate(order):
        if mass >= top_p:
            break
        keep[idx] = True
        mass += p[i]
    return np.where(keep, x, -np.inf)


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.5, 3, 1.0), (1.0, 0, 0.6),
                                                     (2.0, 4, 0.5), (1.0, 0, 0.05)])
def test_filter_logits_matches_numpy(temperature, top_k, top_p, rng):
    logits = rng.randn(3, 12).astype(np.float32) * 2
    scfg = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
    got = np.asarray(filter_logits(jnp.asarray(logits), scfg))
    for b in range(3):
        np.testing.assert_allclose(got[b], _np_filter(logits[b], temperature, top_k, top_p), rtol=1e-6)


def test_greedy_select_is_first_argmax_with_model_logprob(rng):
    logits = rng.randn(64, 50).astype(np.float32)
    logits[::2, 7] = logits[::2, 31] = logits[::2].max(axis=1) + 1.0   # ties: the first index wins
    logits[1, :] = -3.0                                                # a flat row: index 0
    tokens, lp, mlp = select_tokens(jnp.asarray(logits), jax.random.key(0), SamplingConfig(temperature=0.0))
    np.testing.assert_array_equal(tokens, np.argmax(logits, axis=1))
    assert (tokens[::2] == 7).all() and tokens[1] == 0 and (np.asarray(lp) == 0).all()
    want = np.asarray(jax.nn.log_softmax(logits))[np.arange(64), np.argmax(logits, axis=1)]
    np.testing.assert_allclose(mlp, want, atol=1e-5)
    # the traced flag of one jitted program: greedy where true, the config's draw where false
    pick = jax.jit(lambda x, k, g: select_tokens(x, k, SamplingConfig(temperature=1.0, top_k=5), greedy=g))
    for a, b in zip(pick(jnp.asarray(logits), jax.random.key(0), True), (tokens, lp, mlp)):
        np.testing.assert_array_equal(a, b)
    drawn = select_tokens(jnp.asarray(logits), jax.random.key(0), SamplingConfig(temperature=1.0, top_k=5))
    for a, b in zip(pick(jnp.asarray(logits), jax.random.key(0), False), drawn):
        np.testing.assert_array_equal(a, b)


def test_sampling_frequencies_follow_the_filtered_distribution():
    logits = jnp.asarray([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]])
    scfg = SamplingConfig(temperature=0.8, top_p=0.9)
    keys = jax.random.split(jax.random.key(0), 20000)
    toks, lp, _ = jax.vmap(lambda k: select_tokens(logits, k, scfg))(keys)
    probs = np.asarray(jax.nn.softmax(filter_logits(logits, scfg))[0])
    freq = np.bincount(np.asarray(toks[:, 0]), minlength=6) / 20000
    assert freq[probs == 0].sum() == 0
    np.testing.assert_allclose(freq, probs, atol=0.015)
    np.testing.assert_allclose(np.exp(lp[:, 0]), probs[np.asarray(toks[:, 0])], rtol=1e-5)


def test_sharded_sampler_matches_single_device(tiny_cfg, tiny_params, greedy_out):
    mesh = make_mesh(MeshConfig(2, 2, 2))
    sampler = Sampler(tiny_cfg, SamplingConfig(temperature=0.0, max_new_tokens=N), mesh=mesh)
    params = jax.tree.map(jax.device_put, tiny_params, sampler.param_shardings(tiny_params))
    tokens, mask = pad_prompts(PROMPTS)
    out = sampler(params, tokens, prompt_mask=mask)
    np.testing.assert_array_equal(out.tokens, greedy_out.tokens)
    np.testing.assert_allclose(out.model_logprobs, greedy_out.model_logprobs, atol=1e-5)
    # batch of 4 over data x fsdp = 4 shards: one row per shard
    assert out.tokens.sharding.shard_shape(out.tokens.shape) == (1, N)
    # the cache buffer is donated and can be handed back for the next batch
    again = sampler(params, tokens, prompt_mask=mask, cache=out.cache)
    assert out.cache.k[0].is_deleted()
    np.testing.assert_array_equal(again.tokens, greedy_out.tokens)
    # the cache windows of a segmented decode are laid out like the cache: per device
    # one row and one kv head of a 16-slot key window, never all four rows
    long = Sampler(tiny_cfg, SamplingConfig(temperature=0.0, max_new_tokens=40), mesh=mesh)
    fn = long._compile(params, 4, long.init_cache(4, 6), (False, False, False))
    hlo = fn.lower(params, tokens, mask, jax.random.key(0), long.init_cache(4, 6), None, None, None).compile().as_text()
    assert "f32[1,1,8,16]" in hlo and "f32[4,2,8,16]" not in hlo


def test_bad_prompts_raise(greedy, tiny_params):
    tokens, mask = pad_prompts(PROMPTS)
    mask[2] = False
    with pytest.raises(ValueError, match="at least one real"):
        greedy(tiny_params, tokens, prompt_mask=mask)
    with pytest.raises(ValueError, match="token ids"):
        greedy(tiny_params, np.array([[1, 999]]))
    with pytest.raises(ValueError):
        pad_prompts([[1], []])
    with pytest.raises(ValueError):
        SamplingConfig(top_p=0.0)


@pytest.mark.parametrize("bad, match", [(dict(temperature=-1.0), "temperature"), (dict(top_k=-2), "top_k"),
                                        (dict(top_p=0.0), "top_p"), (dict(max_new_tokens=0), "max_new_tokens"),
                                        (dict(decode_segments=0), "decode_segments")])
def test_bad_sampling_config_raises(bad, match):
    with pytest.raises(ValueError, match=match):
        SamplingConfig(**bad)
