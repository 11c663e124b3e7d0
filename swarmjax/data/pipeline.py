"""Task-set input pipeline: prepared TFDS splits -> sharded, shuffled, batched grain
iterators -> ``widesearch_jax.Tasks``.

- :func:`prepare` writes (or reuses) a task set with the TFDS builder of
  ``swarmjax.data.builder`` and returns one random-access data source per split.
- :func:`task_iterator` reads one source with ``grain.MapDataset``: this process's
  slice of the records, shuffled, repeated, in fixed-size batches. Its iterator's
  ``get_state()`` is a small JSON-serialisable dict, so it can go in a checkpoint and
  ``set_state()`` resumes with exactly the batches the original would have yielded.
- :func:`to_tasks` turns a batch into the ``Tasks`` the environment steps on.

``tensorflow_datasets`` is imported only inside :func:`prepare`, so this module (and
``swarmjax.data``) import without it; TensorFlow is never needed.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import grain
import jax
import jax.numpy as jnp
import numpy as np

from swarmjax.envs import widesearch_jax as wsj
from swarmjax.envs.widesearch import WideSearchConfig

SPLITS = ("train", "validation", "test")


def prepare(env: WideSearchConfig, data_dir: str, *, train_size: int = 20000,
            validation_size: int = 512, test_size: int = 512,
            seed: int = 0) -> dict[str, Sequence[dict[str, Any]]]:
    """Prepare the task set of ``env`` under ``data_dir`` (reused if already there) and
    return ``{split: source}`` for the non-empty splits of ``SPLITS``.

    A source is a random-access sequence (TFDS ``ArrayRecordDataSource``) of records
    ``{"table": int32 [E], "entities": int32 [N_max], "n": int32 [], "task_id": bytes}``
    with E = ``env.num_entities``, N_max = ``env.max_task_size``. The same arguments
    give the same records (in the same order) in any ``data_dir``. With several
    processes sharing one ``data_dir``, prepare on one process first (TFDS writes to a
    temporary directory and renames it, but concurrent writers duplicate the work).
    """
    from swarmjax.data import builder as builder_lib   # imports tensorflow_datasets

    builder = builder_lib.build(env, data_dir, train_size=train_size,
                                validation_size=validation_size, test_size=test_size,
                                seed=seed)
    sources = builder.as_data_source()
    out = {s: sources[s] for s in SPLITS if s in sources}
    for src in out.values():
        check_source(src, env)
    return out


def check_source(source: Sequence[Mapping[str, Any]], env: WideSearchConfig) -> None:
    """Raise ``ValueError`` unless ``source``'s records fit ``env``: ``table`` [E],
    ``entities`` [N_max], a scalar ``n``. Reads the first record only."""
    if len(source) == 0:
        raise ValueError("the task source is empty")
    rec = source[0]
    missing = {"table", "entities", "n"} - set(rec)
    if missing:
        raise ValueError(f"task records lack {sorted(missing)}; got keys {sorted(rec)}")
    want = {"table": (env.num_entities,), "entities": (env.max_task_size,), "n": ()}
    for key, shape in want.items():
        got = np.shape(rec[key])
        if got != shape:
            raise ValueError(f"task record {key!r} has shape {got}, the env needs {shape} "
                             f"(num_entities={env.num_entities}, "
                             f"max_task_size={env.max_task_size})")


def _shard(length: int, process_index: int | None,
           process_count: int | None) -> tuple[slice, int, int]:
    """The contiguous slice of ``length`` records that process ``p`` of ``P`` reads.
    Every process gets ``length // P`` records; the last ``length % P`` are unused."""
    P = jax.process_count() if process_count is None else int(process_count)
    p = jax.process_index() if process_index is None else int(process_index)
    if P < 1 or not 0 <= p < P:
        raise ValueError(f"need 0 <= process_index < process_count, got {p} of {P}")
    per = length // P
    return slice(p * per, (p + 1) * per), p, P


def _int32(rec: Mapping[str, Any]) -> dict[str, Any]:
    """One record with int32 ``table`` / ``entities`` / ``n`` (TFDS gives ``n`` as int)."""
    out = dict(rec)
    for key in ("table", "entities", "n"):
        out[key] = np.asarray(rec[key], np.int32)
    return out


def task_iterator(source: Sequence[Mapping[str, Any]], batch_size: int, seed: int = 0, *,
                  shuffle: bool = True, num_epochs: int | None = None,
                  process_index: int | None = None, process_count: int | None = None,
                  env: WideSearchConfig | None = None,
                  read_options: grain.ReadOptions | None = None,
                  focus_min_n: int | None = None, focus_fraction: float = 0.0) -> grain.DatasetIterator:
    """Batches of this process's share of ``source``.

    Process ``p`` of ``P`` (default ``jax.process_index()`` / ``jax.process_count()``)
    reads records ``[p * L // P, (p + 1) * L // P)`` of the ``L`` in ``source``, so the
    processes see disjoint slices of equal size. The slice is shuffled with ``seed``
    (reshuffled every epoch), repeated ``num_epochs`` times (None: forever), and cut
    into batches of ``batch_size`` (an incomplete last batch is dropped). One pass with
    ``num_epochs=1`` therefore yields every record of the slice at most once.

    Each batch is ``{"table": int32 [B, E], "entities": int32 [B, N_max],
    "n": int32 [B], "task_id": bytes [B]}`` with B = ``batch_size``. The returned
    iterator's ``get_state()`` is a JSON-serialisable dict; ``set_state(state)`` on a
    fresh iterator built with the same arguments continues exactly where it left off.

    ``env``, if given, is checked against the record shapes (``ValueError`` on a
    mismatch). ``read_options`` defaults to 2 reader threads and 8 prefetched batches.

    Oversampling large tasks: with ``focus_fraction`` f > 0, a fraction f of the
    records comes from the slice's tasks with ``n >= focus_min_n`` and 1 - f from the
    whole slice (``grain.MapDataset.mix`` of two shuffled, endlessly repeated streams;
    ``num_epochs`` must be None). Finds those tasks by reading every ``n`` of the
    slice once (about a second for 20k ArrayRecord records).
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) \
            or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    if num_epochs is not None and (not isinstance(num_epochs, (int, np.integer))
                                   or num_epochs < 1):
        raise ValueError(f"num_epochs must be None (forever) or an int >= 1, got {num_epochs!r}")
    if env is not None:
        check_source(source, env)
    shard, p, P = _shard(len(source), process_index, process_count)
    per = shard.stop - shard.start
    if batch_size > per:
        raise ValueError(f"batch_size {batch_size} is larger than the {per} records process "
                         f"{p} of {P} gets from a source of {len(source)}")
    if not 0.0 <= focus_fraction < 1.0:
        raise ValueError(f"focus_fraction must be in [0, 1), got {focus_fraction!r}")
    base = grain.MapDataset.source(source).slice(shard)

    def stream(ds, salt):
        ds = ds.map(_int32)
        if shuffle:
            ds = ds.shuffle(seed=int(seed) + salt)
        return ds.repeat(num_epochs)

    ds = stream(base, 0)
    if focus_fraction > 0:
        if num_epochs is not None:
            raise ValueError("focus_fraction > 0 mixes endless streams: num_epochs must be None")
        if focus_min_n is None:
            raise ValueError("focus_fraction > 0 needs focus_min_n")
        large = [i for i in range(per) if int(base[i]["n"]) >= focus_min_n]
        if not large:
            raise ValueError(f"process {p} of {P} has no task with n >= {focus_min_n} in its "
                             f"{per} records")
        focus = grain.MapDataset.source(large).map(lambda i: base[i])
        ds = grain.MapDataset.mix([ds, stream(focus, 1)], weights=[1.0 - focus_fraction, focus_fraction])
    ds = ds.batch(int(batch_size), drop_remainder=True)
    if read_options is None:
        read_options = grain.ReadOptions(num_threads=2, prefetch_buffer_size=8)
    return iter(ds.to_iter_dataset(read_options))


def to_tasks(batch: Mapping[str, Any]) -> wsj.Tasks:
    """A batch from :func:`task_iterator` as ``Tasks`` (jnp int32: table [B, E],
    entities [B, N_max], n [B]); ``task_id`` is dropped."""
    try:
        table, entities, n = (np.asarray(batch[k]) for k in ("table", "entities", "n"))
    except KeyError as e:
        raise ValueError(f"batch lacks {e.args[0]!r}; keys {sorted(batch)}") from None
    if table.ndim != 2 or entities.ndim != 2 or n.ndim != 1 \
            or not table.shape[0] == entities.shape[0] == n.shape[0]:
        raise ValueError(f"need table [B, E], entities [B, N_max], n [B]; got shapes "
                         f"{table.shape}, {entities.shape}, {n.shape}")
    return wsj.Tasks(table=jnp.asarray(table, jnp.int32),
                     entities=jnp.asarray(entities, jnp.int32),
                     n=jnp.asarray(n, jnp.int32))
