"""Fixed wide-search task sets: a TFDS builder (``swarmjax.data.builder``, imported
lazily: it needs ``tensorflow_datasets``) and a grain pipeline
(``swarmjax.data.pipeline``) that feeds them to training as ``widesearch_jax.Tasks``."""

from swarmjax.data.pipeline import SPLITS, check_source, prepare, task_iterator, to_tasks

__all__ = ["SPLITS", "check_source", "prepare", "task_iterator", "to_tasks"]
