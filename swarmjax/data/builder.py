"""TFDS builder for fixed wide-search task sets (``WideSearchTasks``).

Each example is one task of the wide-search environment (docs/design.md section 3), the
same fields ``swarmjax.envs.widesearch_jax.reset`` samples on the fly:

- ``table``    int32 [E]      hidden values, each in [0, V)
- ``entities`` int32 [N_max]  ``n`` distinct entities in [0, E), then -1 padding
- ``n``        int32 []       task size in [min_task_size, max_task_size]
- ``task_id``  string         ``"<split>/<index>"``, unique across the task set

Generation is pure numpy (no JAX): split ``train`` / ``validation`` / ``test`` draws
from its own child of ``np.random.SeedSequence(seed)`` (spawn keys 0 / 1 / 2), so the
splits come from disjoint streams and a split's content does not depend on the sizes of
the others. Nothing is downloaded. The config name encodes E, V, the task-size range,
the split sizes and the seed, so different task sets never share a cache directory, and
preparing the same one again reuses the files.

TensorFlow is not needed: TFDS writes ``array_record`` files with its own copy of the
``tf.train.Example`` proto and reads them back through ``as_data_source`` with a numpy
example parser. Import this module only when preparing (it imports ``tensorflow_datasets``).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow_datasets as tfds
from etils import epath

from swarmjax.data.pipeline import SPLITS   # also the spawn-key order of the seed streams
from swarmjax.envs.widesearch import WideSearchConfig

FILE_FORMAT = "array_record"


@dataclasses.dataclass(eq=False)
class WideSearchTasksConfig(tfds.core.BuilderConfig):
    """One task set: environment sizes, split sizes and the generation seed.

    Build it with :meth:`make`, which derives ``name`` from every field that changes
    the data."""

    num_entities: int = 32
    num_values: int = 32
    min_task_size: int = 1
    max_task_size: int = 16
    train_size: int = 20000
    validation_size: int = 512
    test_size: int = 512
    seed: int = 0

    @classmethod
    def make(cls, env: WideSearchConfig, *, train_size: int = 20000,
             validation_size: int = 512, test_size: int = 512,
             seed: int = 0) -> "WideSearchTasksConfig":
        sizes = dict(train=train_size, validation=validation_size, test=test_size)
        for split, size in sizes.items():
            if not isinstance(size, (int, np.integer)) or size < 0:
                raise ValueError(f"{split}_size must be an int >= 0, got {size!r}")
        if not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {seed!r}")
        name = (f"e{env.num_entities}_v{env.num_values}"
                f"_n{env.min_task_size}-{env.max_task_size}"
                f"_tr{train_size}_va{validation_size}_te{test_size}_s{seed}")
        return cls(name=name, description="wide-search task set " + name,
                   num_entities=env.num_entities, num_values=env.num_values,
                   min_task_size=env.min_task_size, max_task_size=env.max_task_size,
                   train_size=int(train_size), validation_size=int(validation_size),
                   test_size=int(test_size), seed=int(seed))

    def split_size(self, split: str) -> int:
        return getattr(self, f"{split}_size")


def generate_split(cfg: WideSearchTasksConfig, split: str) -> dict[str, np.ndarray]:
    """All examples of one split, pure numpy and deterministic in (cfg, split).

    Returns ``table`` int32 [S, E], ``entities`` int32 [S, N_max], ``n`` int32 [S]
    with S = the split's size."""
    seq = np.random.SeedSequence(cfg.seed, spawn_key=(SPLITS.index(split),))
    rng = np.random.default_rng(seq)
    S, E, N = cfg.split_size(split), cfg.num_entities, cfg.max_task_size
    table = rng.integers(0, cfg.num_values, (S, E), dtype=np.int32)
    n = rng.integers(cfg.min_task_size, N + 1, S, dtype=np.int32)
    perm = np.argsort(rng.random((S, E)), axis=1)[:, :N]     # N distinct entities per row
    entities = np.where(np.arange(N)[None] < n[:, None], perm, -1).astype(np.int32)
    return dict(table=table, entities=entities, n=n)


def _keys(arrays: dict[str, np.ndarray]) -> set[bytes]:
    return {t.tobytes() + e.tobytes() for t, e in zip(arrays["table"], arrays["entities"])}


class WideSearchTasks(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """Wide-search task sets. Pass ``config=WideSearchTasksConfig.make(env, ...)``,
    ``data_dir=...`` and ``file_format="array_record"`` (see :func:`build`)."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Initial release."}
    BUILDER_CONFIGS = []   # every task set is a custom config named by its sizes
    # TFDS 4.9.10 finds its own source through `importlib_resources`, which it only declares
    # for Python < 3.9 (tensorflow/datasets#11212); naming the file skips that lookup.
    code_path = epath.Path(__file__)

    def _info(self) -> tfds.core.DatasetInfo:
        c = self.builder_config
        return self.dataset_info_from_configs(
            description="Wide-search tasks: a hidden table and n distinct entities to look up.",
            features=tfds.features.FeaturesDict({
                "table": tfds.features.Tensor(shape=(c.num_entities,), dtype=np.int32),
                "entities": tfds.features.Tensor(shape=(c.max_task_size,), dtype=np.int32),
                "n": tfds.features.Scalar(dtype=np.int32),
                "task_id": tfds.features.Text(),
            }),
            supervised_keys=None,
        )

    def _split_generators(self, dl_manager):
        del dl_manager   # nothing to download
        c = self.builder_config
        data = {s: generate_split(c, s) for s in SPLITS}
        seen: set[bytes] = set()
        for s in SPLITS:   # the streams are disjoint; a clash means the task space is tiny
            keys = _keys(data[s])
            if seen & keys:
                raise ValueError(f"task set {c.name}: split {s} repeats a task of an earlier "
                                 "split; the (table, entities) space is too small")
            seen |= keys
        return {s: self._generate_examples(s, data[s]) for s in SPLITS if c.split_size(s) > 0}

    def _generate_examples(self, split: str, arrays: dict[str, np.ndarray]):
        for i in range(arrays["n"].shape[0]):
            task_id = f"{split}/{i}"
            yield task_id, dict(table=arrays["table"][i], entities=arrays["entities"][i],
                                n=arrays["n"][i], task_id=task_id)


def build(env: WideSearchConfig, data_dir: str, *, train_size: int = 20000,
          validation_size: int = 512, test_size: int = 512,
          seed: int = 0) -> WideSearchTasks:
    """Prepare (or reuse) the task set under ``data_dir`` and return its builder.

    The files land in ``data_dir/wide_search_tasks/<config name>/1.0.0``; a second call
    with the same arguments finds them and writes nothing."""
    config = WideSearchTasksConfig.make(env, train_size=train_size,
                                        validation_size=validation_size,
                                        test_size=test_size, seed=seed)
    builder = WideSearchTasks(config=config, data_dir=str(data_dir), file_format=FILE_FORMAT)
    builder.download_and_prepare(
        file_format=FILE_FORMAT,
        download_config=tfds.download.DownloadConfig(
            compute_stats=tfds.download.ComputeStatsMode.SKIP),
    )
    return builder
