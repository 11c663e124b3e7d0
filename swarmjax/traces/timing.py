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


# The span lists of the stopwatches running now. One listener, registered on first use and
# never unregistered: registering and unregistering a jax.monitoring listener around every
# timed rollout went with a segfault inside XLA's CPU compiler later in the test suite.
_OPEN: list[list[tuple[float, float]]] = []
_REGISTERED: list[bool] = []


def _listen(event: str, start: float, end: float, **_) -> None:
    if event.startswith(COMPILE_EVENTS):
        for spans in _OPEN:
            spans.append((start, end))


@contextlib.contextmanager
def stopwatch() -> Iterator[dict[str, float]]:
    """Time a block: yields a dict that holds, after the block, ``elapsed_s`` (wall time
    of the whole block), ``compile_s`` (of it, JAX tracing / lowering / compiling) and
    ``seconds`` (``elapsed_s - compile_s``, at least 0: the time the work itself took)."""
    if not _REGISTERED:
        monitoring.register_event_time_span_listener(_listen)
        _REGISTERED.append(True)
    spans: list[tuple[float, float]] = []
    out = {"elapsed_s": 0.0, "compile_s": 0.0, "seconds": 0.0}
    _OPEN.append(spans)
    t0 = time.perf_counter()
    try:
        yield out
    finally:
        elapsed = time.perf_counter() - t0
        _OPEN.remove(spans)
        compile_s = min(union_seconds(spans), elapsed)
        out.update(elapsed_s=elapsed, compile_s=compile_s, seconds=max(elapsed - compile_s, 0.0))
