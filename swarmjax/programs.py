"""A jitted function that keeps only its most recently used compiled programs.

``jax.jit`` keeps every program it compiles for the life of the process: its cache is
bounded by entries (thousands), not bytes (jax-ml/jax#16778, #10828). A rollout engine
whose calls come in a few sizes of each of several dimensions (rows, cache windows, for
two roles at once) compiles a program for every combination it meets, so a long run's
host memory grows with every new combination (on XLA:CPU each program also holds its
machine code in its own memory maps: the text rollout reached 10 GB and 110,000 maps in
an hour of RL). :class:`BoundedJit` compiles through ``jit(...).lower(...).compile()``
and keeps the programs of its ``size`` most recently used signatures; an evicted one is
freed, and compiled again (or read from JAX's persistent compilation cache, when one is
set) if its signature comes back.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Hashable
from typing import Any

import jax

__all__ = ["BoundedJit"]


def _signature(x: Any) -> Hashable:
    """What a compiled program is specialised to for one argument leaf: shape, dtype,
    weak type and (for committed arrays) sharding; a Python scalar by its type."""
    if isinstance(x, jax.Array):                               # PRNG keys too (no weak type)
        return x.shape, x.dtype, getattr(x, "weak_type", False), x.sharding if getattr(x, "committed", False) else None
    if hasattr(x, "shape") and hasattr(x, "dtype"):           # numpy arrays and scalars
        return tuple(x.shape), x.dtype
    return type(x)


class BoundedJit:
    """``jax.jit(fn, static_argnums=..., static_argnames=..., **options)`` keeping at most
    ``size`` compiled programs, the least recently used evicted first (module docstring).

    Called as ``fn`` is; the static arguments are hashable and part of the signature with
    every other argument's shapes, dtypes and shardings. ``compiles`` counts the programs
    compiled (evicted ones that came back included)."""

    def __init__(self, fn: Callable, *, size: int, static_argnums: tuple[int, ...] = (),
                 static_argnames: tuple[str, ...] = (), **options):
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        self.fn, self.size = fn, size
        self.static_argnums, self.static_argnames = tuple(static_argnums), tuple(static_argnames)
        self._jit = jax.jit(fn, static_argnums=self.static_argnums, static_argnames=self.static_argnames,
                            **options)
        self.programs: collections.OrderedDict[Hashable, Any] = collections.OrderedDict()
        self.compiles = 0

    def __call__(self, *args, **kwargs):
        statics = (tuple(args[i] for i in self.static_argnums),
                   tuple(sorted((k, v) for k, v in kwargs.items() if k in self.static_argnames)))
        dynamic = (tuple(a for i, a in enumerate(args) if i not in self.static_argnums),
                   {k: v for k, v in kwargs.items() if k not in self.static_argnames})
        leaves, tree = jax.tree.flatten(dynamic)
        key = (statics, tree, tuple(_signature(x) for x in leaves))
        program = self.programs.pop(key, None)
        if program is None:
            program = self._jit.lower(*args, **kwargs).compile()
            self.compiles += 1
        self.programs[key] = program                       # the most recently used, last
        while len(self.programs) > self.size:
            self.programs.popitem(last=False)
        return program(*dynamic[0], **dynamic[1])

    def clear(self) -> None:
        """Drop every compiled program."""
        self.programs.clear()
