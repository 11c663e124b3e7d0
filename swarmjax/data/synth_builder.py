"""TFDS builder for generated tool-environment task sets (``swarmjax envs synth``).

One example is one task (:mod:`swarmjax.envs.synth.generator`): ``task_id`` and ``env``
(text, for filtering and sharding) and ``record`` (the whole task as JSON text: its
query, parts, calls, expected answers and state seed; the environments themselves are
in the task set's ``envs.json``). Splits: ``train``, ``seen``, ``validation``,
``test`` (:data:`swarmjax.envs.synth.generator.SPLITS`), read from the JSON-lines files the
generator wrote beside it, so nothing is generated twice or downloaded. The config name
is a digest of the generator's settings: another task set never reuses these files.
ArrayRecord files, read back as random-access data sources (no TensorFlow needed).
Import this module only to build or read (it imports ``tensorflow_datasets``).
"""

from __future__ import annotations

import dataclasses
import json
import os

import tensorflow_datasets as tfds
from etils import epath

from swarmjax.envs.synth.card import TFDS_NAME
from swarmjax.envs.synth.generator import SPLITS

FILE_FORMAT = "array_record"


@dataclasses.dataclass(eq=False)
class SynthTasksConfig(tfds.core.BuilderConfig):
    """The directory holding the generator's ``<split>.jsonl`` files."""

    source: str = ""


class SynthToolTasks(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """Generated tool-use tasks (module docstring); see :func:`build`. Read back with
    :func:`swarmjax.envs.synth.card.tfds_source`."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Initial release."}
    BUILDER_CONFIGS = []
    code_path = epath.Path(__file__)      # see swarmjax.data.builder: skips a lookup TFDS 4.9.10 gets wrong

    def _info(self) -> tfds.core.DatasetInfo:
        return self.dataset_info_from_configs(
            description="Tool-use tasks in generated stateful environments (swarmjax envs synth).",
            features=tfds.features.FeaturesDict({"task_id": tfds.features.Text(), "env": tfds.features.Text(),
                                                 "record": tfds.features.Text()}),
            supervised_keys=None)

    def _split_generators(self, dl_manager):
        del dl_manager   # nothing to download
        src = self.builder_config.source
        return {s: self._generate_examples(os.path.join(src, f"{s}.jsonl")) for s in SPLITS
                if os.path.getsize(os.path.join(src, f"{s}.jsonl")) > 0}

    def _generate_examples(self, path: str):
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                yield r["task_id"], {"task_id": r["task_id"], "env": r["env"], "record": line.strip()}


def build(source: str, data_dir: str, *, digest: str) -> SynthToolTasks:
    """Prepare (or reuse) the TFDS data set of the JSON-lines splits in ``source`` under
    ``data_dir`` (config ``digest``, the generator settings' digest)."""
    config = SynthTasksConfig(name=digest, description=f"generated task set {digest}", source=os.path.abspath(source))
    builder = SynthToolTasks(config=config, data_dir=str(data_dir), file_format=FILE_FORMAT)
    assert builder.name == TFDS_NAME, builder.name
    builder.download_and_prepare(
        file_format=FILE_FORMAT,
        download_config=tfds.download.DownloadConfig(compute_stats=tfds.download.ComputeStatsMode.SKIP))
    return builder
