"""Device mesh and the one table that maps logical axis names to mesh axes.

Parameters and activations are annotated with *logical* axis names
(``("embed", "mlp")``); :data:`DEFAULT_RULES` says which mesh axis (``data``,
``fsdp``, ``tensor``) each logical name is split over. Changing the parallelism
layout is changing this table, never the model code.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")

# logical name -> mesh axis (or tuple of mesh axes, or None for replicated).
DEFAULT_RULES: dict[str, Any] = {
    "batch": ("data", "fsdp"),   # activations / rollouts: pure data parallel over data x fsdp
    "vocab": "tensor",
    "embed": "fsdp",             # ZeRO-3 style: weights split over fsdp, gathered per layer
    "heads": "tensor",
    "kv_heads": "tensor",
    "head_dim": None,
    "mlp": "tensor",
    "experts": "fsdp",           # expert parallelism: each fsdp device holds E / fsdp whole experts
    "layers": None,
    "norm": None,
    "seq": None,
    "cache_seq": None,
    "adapters": None,            # LoRA: the adapters over one base, each whole on every device
    "lora_rank": None,
}


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Mesh shape over (data, fsdp, tensor). One entry may be -1: "the remaining devices"."""

    data: int = -1
    fsdp: int = 1
    tensor: int = 1

    def shape(self, num_devices: int) -> tuple[int, int, int]:
        """Resolve -1 and check the product against ``num_devices``; raises ValueError."""
        sizes = [self.data, self.fsdp, self.tensor]
        if any(s == 0 or s < -1 for s in sizes):
            raise ValueError(f"mesh sizes must be positive or -1, got {dict(zip(MESH_AXES, sizes))}")
        if sizes.count(-1) > 1:
            raise ValueError(f"at most one mesh axis may be -1, got {dict(zip(MESH_AXES, sizes))}")
        known = math.prod(s for s in sizes if s != -1)
        if -1 in sizes:
            if num_devices % known:
                raise ValueError(f"cannot fill mesh {dict(zip(MESH_AXES, sizes))} with "
                                 f"{num_devices} devices: {num_devices} is not a multiple of {known}")
            sizes[sizes.index(-1)] = num_devices // known
        elif known != num_devices:
            raise ValueError(f"mesh {dict(zip(MESH_AXES, sizes))} needs {known} devices, "
                             f"but {num_devices} are available")
        return tuple(sizes)

    def check_batches(self, num_devices: int, batches: dict[str, int]) -> None:
        """Raise ValueError (one line) for a batch (config field name -> rows) that the
        mesh's batch axes (data x fsdp, :meth:`shape` over ``num_devices``) do not split
        evenly, or for an impossible mesh."""
        shape = self.shape(num_devices)
        rows = shape[0] * shape[1]
        for name, b in batches.items():
            if b % rows:
                raise ValueError(f"{name} = {b} is not divisible by the mesh's data x fsdp = {rows}")


def make_mesh(config: MeshConfig = MeshConfig(), devices: Sequence[jax.Device] | None = None) -> Mesh:
    """Build a ``(data, fsdp, tensor)`` mesh over ``devices`` (default: all devices).

    Axes are ``AxisType.Auto``: the compiler propagates shardings from the
    ``in_shardings``/``out_shardings`` we give ``jax.jit``.
    """
    devices = list(jax.devices() if devices is None else devices)
    shape = config.shape(len(devices))
    return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * 3, devices=devices)


def _mesh_axes_for(name: str | None, rules: Mapping[str, Any]) -> tuple[str, ...]:
    if name is None:
        return ()
    if name not in rules:
        raise KeyError(f"logical axis {name!r} has no sharding rule; known: {sorted(rules)}")
    axes = rules[name]
    if axes is None:
        return ()
    return (axes,) if isinstance(axes, str) else tuple(axes)


def logical_to_spec(logical: Sequence[str | None], shape: Sequence[int], mesh: Mesh,
                    rules: Mapping[str, Any] = DEFAULT_RULES) -> PartitionSpec:
    """Map logical axis names of one array to a mesh ``PartitionSpec``.

    A dimension not divisible by its mesh axes' total size is replicated instead
    (e.g. 2 kv heads on a tensor axis of 4), and a mesh axis is used at most once
    per array (first dimension wins), so every spec this returns is valid.
    """
    if len(logical) != len(shape):
        raise ValueError(f"logical axes {tuple(logical)} do not match shape {tuple(shape)}")
    used: set[str] = set()
    out = []
    for name, size in zip(logical, shape):
        axes = tuple(a for a in _mesh_axes_for(name, rules) if a not in used and mesh.shape[a] > 1)
        total = math.prod(mesh.shape[a] for a in axes)
        if not axes or size % total:
            out.append(None)
            continue
        used.update(axes)
        out.append(axes[0] if len(axes) == 1 else axes)
    return PartitionSpec(*out)


def logical_sharding(logical: Sequence[str | None], shape: Sequence[int], mesh: Mesh,
                     rules: Mapping[str, Any] = DEFAULT_RULES) -> NamedSharding:
    """``NamedSharding`` for one array from its logical axis names."""
    return NamedSharding(mesh, logical_to_spec(logical, shape, mesh, rules))


def tree_shardings(logical_tree: Any, shape_tree: Any, mesh: Mesh,
                   rules: Mapping[str, Any] = DEFAULT_RULES) -> Any:
    """Map a pytree of logical ``PartitionSpec``s (leaves) and a matching pytree of
    arrays / ``ShapeDtypeStruct``s to a pytree of ``NamedSharding``s."""
    is_spec = lambda x: isinstance(x, PartitionSpec)
    return jax.tree.map(lambda spec, x: logical_sharding(tuple(spec), _shape(x), mesh, rules),
                        logical_tree, shape_tree, is_leaf=is_spec)


def _shape(x: Any) -> tuple[int, ...]:
    return tuple(x.shape) if hasattr(x, "shape") else np.shape(x)


def shard_tree(tree: Any, shardings: Any) -> Any:
    """Place every array of ``tree`` with the matching ``NamedSharding`` (host or device input)."""
    return jax.tree.map(lambda x, s: jax.device_put(x, s), tree, shardings)


def batch_sharding(mesh: Mesh, ndim: int, *, rules: Mapping[str, Any] = DEFAULT_RULES,
                   batch_size: int | None = None) -> NamedSharding:
    """Sharding of an array whose leading axis is the batch: split over the batch
    rule's mesh axes (``data`` x ``fsdp``), other axes replicated. When
    ``batch_size`` is given and not divisible, the array is replicated."""
    logical = ("batch",) + (None,) * (ndim - 1)
    shape = (batch_size if batch_size is not None else
             math.prod(mesh.shape[a] for a in _mesh_axes_for("batch", rules)),) + (1,) * (ndim - 1)
    return logical_sharding(logical, shape, mesh, rules)


def rows_sharding(mesh: Mesh, shape: Sequence[int], *, rules: Mapping[str, Any] = DEFAULT_RULES) -> NamedSharding:
    """Sharding of an array of rows ``[B, T, ...]`` inside a step: rows over the batch
    rule's axes (``data`` x ``fsdp``) when ``B`` divides by their device count (as
    :func:`batch_sharding`); otherwise (a minibatch with fewer rows than those axes have
    devices) the positions ``T`` over them, so each device holds a slice of every row
    instead of all of it (XLA gathers keys and values for attention); replicated when
    neither divides."""
    axes = tuple(a for a in _mesh_axes_for("batch", rules) if mesh.shape[a] > 1)
    devices = math.prod(mesh.shape[a] for a in axes)
    if axes and len(shape) >= 2 and shape[0] % devices and not shape[1] % devices:
        return NamedSharding(mesh, PartitionSpec(None, axes if len(axes) > 1 else axes[0]))
    return batch_sharding(mesh, len(shape), rules=rules, batch_size=shape[0])


def _dict_keys(path) -> tuple:
    return tuple(k.key if isinstance(k, jax.tree_util.DictKey) else object() for k in path)


def state_shardings_like(state: Any, params: Any, param_shardings: Any, mesh: Mesh) -> Any:
    """Shardings for a tree that embeds copies of ``params`` (e.g. optax state: Adam's
    ``mu``/``nu``, Muon's momentum): a leaf whose key path ends with a parameter's
    path and has its shape takes that parameter's sharding; everything else (step
    counters, scalars) is replicated. Works through ``MaskedNode``s and partitioned
    states, where ``optax.tree_map_params`` does not."""
    by_path = {}
    for (path, p), s in zip(jax.tree_util.tree_leaves_with_path(params), jax.tree.leaves(param_shardings)):
        by_path[_dict_keys(path)] = (_shape(p), s)
    replicated = NamedSharding(mesh, PartitionSpec())

    def pick(path, leaf):
        keys = _dict_keys(path)
        for start in range(len(keys)):
            hit = by_path.get(keys[start:])
            if hit is not None and hit[0] == _shape(leaf):
                return hit[1]
        return replicated
    return jax.tree_util.tree_map_with_path(pick, state)
