"""Run the parsed tool calls of one or many turns concurrently on a thread pool.

Every call gets a reply string, in call order: the tool's output, or an ``Error: ...``
text the model can read (a failed parse, an exception, a timeout).

Timeouts. ``timeout_s`` bounds a whole :meth:`ToolRunner.run_many` call: it returns
at most about ``timeout_s`` after submitting, and a call not finished by then (still
running, or still queued behind ``max_workers`` busy workers) is reported as timed
out. Give ``max_workers`` at least the number of calls of a batch for each call to get
its full ``timeout_s``. A Python thread cannot be killed: a late call keeps running in
the background and its result is dropped. While one still runs, the next run starts
on a fresh pool so stuck workers do not starve it; the interpreter waits for those
threads at exit, so tools should not block forever.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from types import TracebackType

from swarmjax.text.toolcalls import CallError, ToolCall, error_reply
from swarmjax.text.tools import Tool, ToolSet


@dataclass(frozen=True)
class ToolResult:
    """The reply to one call: ``text`` (output or ``Error: ...``), whether the tool ran
    and returned (``ok``), and its wall time in seconds (0 for calls never run)."""

    text: str
    ok: bool
    seconds: float


def _execute(tool: Tool, arguments: dict) -> ToolResult:
    start = time.perf_counter()
    try:
        text, ok = tool.invoke(arguments), True
    except Exception as e:  # the model sees the error, the rollout goes on
        text, ok = f"Error: {type(e).__name__}: {e}", False
    return ToolResult(text, ok, time.perf_counter() - start)


class ToolRunner:
    """Runs ok calls on a ``ThreadPoolExecutor`` (``max_workers`` threads) with a
    ``timeout_s`` deadline per run; see the module docstring. Thread-safe: one runner
    can serve the episodes of a whole rollout.
    Use as a context manager, or call :meth:`close`."""

    def __init__(self, tools: ToolSet | Iterable[Tool], *, max_workers: int = 8,
                 timeout_s: float = 10.0) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.tools = tools if isinstance(tools, ToolSet) else ToolSet(tools)
        self.max_workers = max_workers
        self.timeout_s = float(timeout_s)
        self._pool = self._new_pool()
        self._late: list[Future] = []  # timed-out calls still running
        self._closed = False
        self._lock = threading.Lock()

    def _new_pool(self) -> ThreadPoolExecutor:
        return ThreadPoolExecutor(self.max_workers, thread_name_prefix="swarmjax-tool")

    def run(self, calls: Sequence[ToolCall], *, tools: ToolSet | None = None) -> list[ToolResult]:
        """The replies to the calls of one turn, in call order. ``tools``: resolve the
        calls against these instead of the runner's own (an episode's tools, e.g. bound
        to its hidden state, on a runner shared by many episodes)."""
        return self.run_many([calls], tools=tools)[0]

    def run_many(self, turns: Sequence[Sequence[ToolCall]], *, tools: ToolSet | None = None
                 ) -> list[list[ToolResult]]:
        """The replies to the calls of many turns (e.g. a batch of episodes), all
        submitted at once so their tools overlap; in turn and call order. Several
        threads may call this at once (the rollout steps episodes in parallel)."""
        tools = self.tools if tools is None else tools
        with self._lock:
            if self._closed:
                raise RuntimeError("ToolRunner is closed")
            self._late = [f for f in self._late if not f.done()]
            if self._late:  # their threads are busy for who knows how long
                self._pool.shutdown(wait=False)
                self._pool, self._late = self._new_pool(), []
            turns = [list(turn) for turn in turns]
            slots = [[self._submit(call, tools) for call in turn] for turn in turns]
        wait([s for row in slots for s in row if isinstance(s, Future)], timeout=self.timeout_s)
        with self._lock:
            return [[self._collect(call, slot) for call, slot in zip(turn, row)]
                    for turn, row in zip(turns, slots)]

    def _submit(self, call: ToolCall, tools: ToolSet) -> ToolResult | Future:
        if not call.ok:
            return ToolResult(error_reply(call), False, 0.0)
        tool = tools.get(call.name)
        if tool is None or tool.fn is None:  # parsed against another tool set, or env-answered
            available = ", ".join(t for t in tools if tools[t].fn is not None) or "none"
            return ToolResult(error_reply(ToolCall(call.name, call.arguments, CallError.UNKNOWN_TOOL,
                                                   f"unknown tool {call.name!r}. Available tools: {available}.",
                                                   call.text)), False, 0.0)
        return self._pool.submit(_execute, tool, dict(call.arguments or {}))

    def _collect(self, call: ToolCall, slot: ToolResult | Future) -> ToolResult:
        if isinstance(slot, ToolResult):
            return slot
        if slot.done() and not slot.cancelled():
            e = slot.exception()  # only a BaseException escapes _execute
            return slot.result() if e is None else ToolResult(f"Error: {type(e).__name__}: {e}", False, 0.0)
        if not slot.cancel():
            self._late.append(slot)
        return ToolResult(f"Error: tool {call.name!r} timed out after {self.timeout_s:g}s.", False, self.timeout_s)

    def close(self) -> None:
        """Stop taking calls; queued calls are cancelled, running ones are left to end."""
        self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> ToolRunner:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
