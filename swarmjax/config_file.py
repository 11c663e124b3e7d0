"""Load a job configuration from a Python file (``configs/*.py``).

A config file defines ``get_config()`` returning a typed dataclass. Plain Python
is the config language: it is checked by the interpreter, can import presets,
and needs no schema of its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import sys
import traceback
from typing import Any


def load_config(path: str, expected_type: type | None = None) -> Any:
    """Import ``path`` and return ``get_config()``; raises ValueError with the file
    name when the file is missing, lacks ``get_config`` or returns the wrong type. The
    file's directory goes on ``sys.path``, so it may import modules beside it."""
    if not os.path.isfile(path):
        raise ValueError(f"config file {path!r} does not exist")
    here = os.path.dirname(os.path.abspath(path))
    if here not in sys.path:             # the config's own modules (a task beside it) import as top-level modules
        sys.path.insert(0, here)
    name = "_swarmjax_config_" + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    with _config_errors(path):
        spec.loader.exec_module(module)
    if not callable(getattr(module, "get_config", None)):
        raise ValueError(f"config file {path!r} defines no get_config()")
    with _config_errors(path):
        config = module.get_config()
    if expected_type is not None and not isinstance(config, expected_type):
        raise ValueError(f"config file {path!r}: get_config() returned "
                         f"{type(config).__name__}, expected {expected_type.__name__}")
    if not dataclasses.is_dataclass(config):
        raise ValueError(f"config file {path!r}: get_config() must return a dataclass")
    return config


@contextlib.contextmanager
def _config_errors(path: str):
    """A config file's own error (a syntax error, a failed import, an exception in
    ``get_config()``) as one ValueError line naming the file and line; a ValueError from
    a config's validation passes as it is."""
    try:
        yield
    except ValueError:
        raise
    except SyntaxError as e:
        raise ValueError(f"config file {path!r}, line {e.lineno}: {type(e).__name__}: {e.msg}") from None
    except Exception as e:              # noqa: BLE001 - the user's code: any error, one line
        here = os.path.abspath(path)
        lines = [f.lineno for f in traceback.extract_tb(e.__traceback__) if os.path.abspath(f.filename) == here]
        where = f", line {lines[-1]}" if lines else ""
        raise ValueError(f"config file {path!r}{where}: {type(e).__name__}: {e}") from None


def _field_type(cls: type, name: str, path: str):
    import typing

    names = [f.name for f in dataclasses.fields(cls)]
    if name not in names:
        raise ValueError(f"--set {path}: {cls.__name__} has no field {name!r} (fields: {', '.join(names)})")
    return typing.get_type_hints(cls)[name]


def _check_type(value: Any, hint: Any, path: str) -> Any:
    import types
    import typing

    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        for option in args:
            try:
                return _check_type(value, option, path)
            except ValueError:
                continue
        raise ValueError(f"--set {path}: {value!r} is not a {hint}")
    if hint is type(None):
        if value is None:
            return None
    elif hint is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    elif hint is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    elif hint in (str, bool) and type(value) is hint:
        return value
    elif origin is tuple and isinstance(value, (tuple, list)):
        inner = args[0] if args else Any
        return tuple(v if inner is Any else _check_type(v, inner, path) for v in value)
    elif hint is Any:
        return value
    raise ValueError(f"--set {path}: {value!r} is not a {getattr(hint, '__name__', hint)}")


def _optional_section(hint: Any) -> type | None:
    """The dataclass type ``X`` of a ``X | None`` annotation, else None."""
    import typing

    options = [a for a in typing.get_args(hint) if a is not type(None)]
    if len(options) == 1 and dataclasses.is_dataclass(options[0]):
        return options[0]
    return None


def apply_overrides(config: Any, overrides: list[str]) -> Any:
    """Apply ``--set a.b.c=VALUE`` overrides to a (nested, frozen) dataclass config.

    VALUE is a Python literal (``3e-4``, ``16``, ``True``, ``None``, ``(1, 4)``,
    ``'cosine'``; a bare word is taken as a string). The dotted path must name a
    field, and the value must fit its type annotation; errors are one line naming
    the override. Overlapping overrides apply in order (``mesh=None`` then
    ``mesh.data=4``: a mesh of the section's defaults with ``data=4``; ``mesh.data=4``
    then ``mesh=None``: no mesh). The nested replacement itself is ``simple_parsing.replace``.
    """
    import ast
    import typing

    import simple_parsing

    changes: dict[str, Any] = {}
    for item in overrides:
        path, sep, raw = item.partition("=")
        path = path.strip()
        if not sep or not path:
            raise ValueError(f"--set takes FIELD=VALUE, got {item!r}")
        try:
            value = ast.literal_eval(raw.strip())
        except (ValueError, SyntaxError):
            value = raw.strip()
        for k in [k for k in changes if path.startswith(k + ".")]:      # a section set before a field of it
            config = _replace(config, {k: changes.pop(k)})
        for k in [k for k in changes if k.startswith(path + ".")]:      # fields of a section set now
            del changes[k]
        node, parts = config, path.split(".")
        for i, part in enumerate(parts):
            hint = _field_type(type(node), part, path)
            if isinstance(hint, typing.TypeVar):    # a generic record's field (Roles[int]): its value's type
                hint = type(getattr(node, part))
            if i < len(parts) - 1:
                node = getattr(node, part)
                if node is None and (section := _optional_section(hint)) is not None:
                    # an unset optional section (e.g. ``mesh: MeshConfig | None = None``):
                    # --set mesh.data=4 starts from the section's defaults
                    node = section()
                    config = simple_parsing.replace(config, {".".join(parts[:i + 1]): node})
                if not dataclasses.is_dataclass(node):
                    raise ValueError(f"--set {path}: {'.'.join(parts[:i + 1])} is not a config section")
        changes[path] = _check_type(value, hint, path)
    return _replace(config, changes)


def _replace(config: Any, changes: dict[str, Any]) -> Any:
    """``simple_parsing.replace`` with a config's own validation errors (``__post_init__``)
    as one line."""
    import simple_parsing

    try:
        return simple_parsing.replace(config, changes)
    except (TypeError, ValueError) as e:
        raise ValueError(f"--set: {e}") from None
