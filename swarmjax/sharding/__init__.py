"""Device mesh (data, fsdp, tensor) and logical-axis sharding rules."""

from swarmjax.sharding.mesh import (DEFAULT_RULES, MESH_AXES, MeshConfig, batch_sharding,
                                    logical_sharding, logical_to_spec, make_mesh, shard_tree,
                                    tree_shardings)

__all__ = ["DEFAULT_RULES", "MESH_AXES", "MeshConfig", "batch_sharding", "logical_sharding",
           "logical_to_spec", "make_mesh", "shard_tree", "tree_shardings"]
