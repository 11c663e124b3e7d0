"""Wall-clock time of a block of JAX work, without the time JAX spent compiling it.

A trace's ``costs.wall_clock_s`` must be a measure of the episode, not of the first
call's tracing and XLA compilation (tens of seconds on a first evaluation, nothing on
the next). :func:`stopwatch` times a block with ``time.perf_counter`` and subtracts the
time JAX reports (through :mod:`jax.monitoring` time spans) for tracing, lowering and
compiling inside it: the union of the ``/jax/core/compile/*`` intervals, so nested
spans (an inner jit traced while the outer one is) count once. The caller must wait for
its results inside the block (``jax.block_until_ready``): JAX dispatches asynchronously.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from jax import monitoring

COMPILE_EVENTS = "/jax/core/compile/"       # jaxpr trace, MLIR lowering, backend compile


def union_seconds(spans: list[tuple[float, float]]) -> float:
    """Length of the union of intervals ``[(start, end), ...]`` (seconds)."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


@contextlib.contextmanager
def stopwatch() -> Iterator[dict[str, float]]:
    """Time a block: yields a dict that holds, after the block, ``elapsed_s`` (wall time
    of the whole block), ``compile_s`` (of it, JAX tracing / lowering / compiling) and
    ``seconds`` (``elapsed_s - compile_s``, at least 0: the time the work itself took)."""
    spans: list[tuple[float, float]] = []

    def listen(event: str, start: float, end: float, **_) -> None:
        if event.startswith(COMPILE_EVENTS):
            spans.append((start, end))

    out = {"elapsed_s": 0.0, "compile_s": 0.0, "seconds": 0.0}
    monitoring.register_event_time_span_listener(listen)
    t0 = time.perf_counter()
    try:
        yield out
    finally:
        elapsed = time.perf_counter() - t0
        monitoring.unregister_event_time_span_listener(listen)
        compile_s = min(union_seconds(spans), elapsed)
        out.update(elapsed_s=elapsed, compile_s=compile_s, seconds=max(elapsed - compile_s, 0.0))
