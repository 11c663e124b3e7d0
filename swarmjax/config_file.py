"""Load a job configuration from a Python file (``configs/*.py``).

A config file defines ``get_config()`` returning a typed dataclass. Plain Python
is the config language: it is checked by the interpreter, can import presets,
and needs no schema of its own.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from typing import Any


def load_config(path: str, expected_type: type | None = None) -> Any:
    """Import ``path`` and return ``get_config()``; raises ValueError with the file
    name when the file is missing, lacks ``get_config`` or returns the wrong type."""
    if not os.path.isfile(path):
        raise ValueError(f"config file {path!r} does not exist")
    name = "_swarmjax_config_" + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not callable(getattr(module, "get_config", None)):
        raise ValueError(f"config file {path!r} defines no get_config()")
    config = module.get_config()
    if expected_type is not None and not isinstance(config, expected_type):
        raise ValueError(f"config file {path!r}: get_config() returned "
                         f"{type(config).__name__}, expected {expected_type.__name__}")
    if not dataclasses.is_dataclass(config):
        raise ValueError(f"config file {path!r}: get_config() must return a dataclass")
    return config
