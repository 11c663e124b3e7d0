"""Compile once: JAX's persistent compilation cache for jobs, and what compiling cost.

A job's programs (the rollout's decode and append, the update, the warm start's step)
take seconds to minutes to compile, on every start and every resume. With the persistent
cache on, XLA's executables are written to a directory keyed by the program, its
shapes, the backend and the compiler flags, and a later process with the same programs
loads them instead of compiling.

* :func:`cache_dir` resolves where: an explicit path (``gs://`` too: JAX writes the
  cache through ``etils.epath``), ``"off"``, or by default ``$SWARMJAX_COMPILE_CACHE``, else
  ``$JAX_COMPILATION_CACHE_DIR``, else ``$XDG_CACHE_HOME/swarmjax/xla``
  (``~/.cache/swarmjax/xla``): a user cache, so a repeated job in a new workdir hits it too.
* :func:`enable` turns the cache on for this process (every program, however quick to
  compile, unless ``$JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS`` says otherwise), or off.
* :class:`CompileClock` sums the compile events JAX reports (XLA compile seconds, cache
  hits and misses) while it is installed: the job's summary records them, so a second
  start's cost can be read against the first's.
"""

from __future__ import annotations

import os
import threading

import jax

__all__ = ["cache_dir", "enable", "CompileClock", "ENV"]

ENV = "SWARMJAX_COMPILE_CACHE"       # a directory, or "off"
_EVENTS = {"/jax/core/compile/backend_compile_duration": "compile_s",
           "/jax/compilation_cache/cache_retrieval_time_sec": "cache_load_s"}
_COUNTS = {"/jax/compilation_cache/cache_hits": "cache_hits",
           "/jax/compilation_cache/cache_misses": "cache_misses"}


def cache_dir(setting: str | None = None) -> str | None:
    """Where the cache goes: ``setting`` (a path, or ``"off"``: None), else ``$SWARMJAX_COMPILE_CACHE``,
    else JAX's own ``$JAX_COMPILATION_CACHE_DIR``, else the user cache ``$XDG_CACHE_HOME/swarmjax/xla``."""
    for value in (setting, os.environ.get(ENV), os.environ.get("JAX_COMPILATION_CACHE_DIR")):
        if value is not None:
            setting = value
            break
    if setting is not None and setting.strip().lower() in ("off", "none", "0", ""):
        return None
    if setting:
        return setting
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "swarmjax", "xla")


def enable(path: str | None) -> str | None:
    """Use the persistent cache at ``path`` in this process (None: off). Every program is
    cached, whatever its compile time and size. -> ``path``."""
    from jax._src import compilation_cache        # reset: a program compiled before this call
    if path is not None and "://" not in path:    # (an import-time jit) must not have fixed it off
        os.makedirs(path, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", path)
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    compilation_cache.reset_cache()
    return path


class CompileClock:
    """Sums JAX's compile events while installed (a context manager): ``compile_s`` (XLA
    compile seconds), ``cache_load_s`` (seconds loading cached executables),
    ``cache_hits`` and ``cache_misses``. ``figures()`` -> those four."""

    def __init__(self):
        self._lock = threading.Lock()
        self._sums = dict.fromkeys([*_EVENTS.values(), *_COUNTS.values()], 0.0)

    def _duration(self, event: str, seconds: float, **_) -> None:
        if event in _EVENTS:
            with self._lock:
                self._sums[_EVENTS[event]] += seconds

    def _event(self, event: str, **_) -> None:
        if event in _COUNTS:
            with self._lock:
                self._sums[_COUNTS[event]] += 1

    def __enter__(self) -> CompileClock:
        from jax._src import monitoring

        monitoring.register_event_duration_secs_listener(self._duration)
        monitoring.register_event_listener(self._event)
        return self

    def __exit__(self, *exc) -> None:
        from jax._src import monitoring

        monitoring.unregister_event_duration_listener(self._duration)
        monitoring.unregister_event_listener(self._event)

    def figures(self) -> dict[str, float]:
        with self._lock:
            return {k: round(v, 3) if k.endswith("_s") else int(v) for k, v in self._sums.items()}
