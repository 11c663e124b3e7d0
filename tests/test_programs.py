"""BoundedJit: the results of jax.jit, at most ``size`` compiled programs kept (the least
recently used evicted and freed), a program compiled again when its signature returns."""

import gc
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from swarmjax.programs import BoundedJit


def _f(x, n, y, *, k, z=None):
    out = x * n + jnp.sum(y) * k
    return out if z is None else out + z


def test_bounded_jit_equals_jit_and_keeps_the_most_recent_programs():
    fn = BoundedJit(_f, size=2, static_argnums=(1,), static_argnames=("k",), donate_argnums=(0,))
    ref = jax.jit(_f, static_argnums=(1,), static_argnames=("k",))
    calls = [(3, 2, 1, None), (4, 2, 1, None), (3, 2, 1, None), (3, 5, 1, None), (3, 2, 2, 1.0), (4, 2, 1, None)]
    for size, n, k, z in calls:
        x, y = jnp.arange(size, dtype=jnp.float32), np.ones(size, np.float32)
        want = ref(x, n, y, k=k, z=None if z is None else jnp.float32(z))
        got = fn(jnp.arange(size, dtype=jnp.float32), n, y, k=k, z=None if z is None else jnp.float32(z))
        np.testing.assert_array_equal(got, want)
        assert len(fn.programs) <= 2
    # signatures: (3,2,1) (4,2,1) hit (3,5,1) (3,2,2,z) then (4,2,1) again: evicted by then
    assert fn.compiles == 5
    first = weakref.ref(next(iter(fn.programs.values())))
    fn(jnp.ones(7), 2, np.ones(7, np.float32), k=1)
    fn(jnp.ones(8), 2, np.ones(8, np.float32), k=1)
    gc.collect()
    assert first() is None                                              # an evicted program is freed
    with pytest.raises(ValueError, match="size must be >= 1"):
        BoundedJit(_f, size=0)
