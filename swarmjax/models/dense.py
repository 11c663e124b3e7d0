"""The decoder's linear map with a backward pass of its own (:func:`dense`), used by the
SwiGLU of :class:`swarmjax.models.transformer.MLP`."""

from __future__ import annotations

import jax

Array = jax.Array


@jax.custom_vjp
def dense(x: Array, w: Array) -> Array:
    """y = x W for x [B, T, I], w [I, O] -> [B, T, O], with its own backward pass:
    dx = dy W^T and dW = x^T dy over the B T rows flattened ([B T, I]^T [B T, O]).

    The same math as ``x @ w``. On XLA:CPU the autodiff of ``x @ w`` under the layer
    ``lax.scan`` fuses the SwiGLU's elementwise backward into a transposing copy of the
    [B T, F] activations for dW (a strided [F, B T] write, about half of a warm-start
    gradient at 16 x 768 rows); here the backward sees only x and dy, and that copy is
    not made (``python bench/mlp_backward.py``: the context config's warm-start gradient at
    16 x 768 1.37x faster on a 2-core CPU at a 200 GFLOP/s matmul peak, the gradients equal)."""
    return x @ w


def _dense_fwd(x: Array, w: Array):
    return x @ w, (x, w)


def _dense_bwd(res, dy: Array):
    x, w = res
    dx = dy @ w.T                                                           # [B, T, I]
    dw = x.reshape(-1, x.shape[-1]).T @ dy.reshape(-1, dy.shape[-1])        # [I, O]
    return dx, dw.astype(w.dtype)


dense.defvjp(_dense_fwd, _dense_bwd)
