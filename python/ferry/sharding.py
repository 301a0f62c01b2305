"""ferry.sharding: what one rank of a sharded trainer holds, in global coordinates
(docs/sharded.md).

A rank pushes blocks of global tensors: `Block(tensor, global_shape, offsets)` wraps a plain
tensor (any tensor ferry reads: PyTorch, NumPy, __dlpack__) that holds the block of the global
tensor of `global_shape` starting at `offsets`; `replica=True` declares a block this rank holds
but a lower rank sends (the lowest rank holding a replicated block sends it). A torch DTensor
(placements Shard(d) and Replicate) is read as its local shard with the block its mesh
coordinate gives; Partial placements are refused (reduce first).
"""

import math

from . import errors


class Block:
    """A block of a global tensor held by this rank: `tensor` is the block itself (compact,
    row-major; its shape is the block's extent per dimension), starting at `offsets` in the
    global tensor of `global_shape`."""

    def __init__(self, tensor, global_shape, offsets=None, replica=False):
        self.tensor = tensor
        self.global_shape = tuple(int(d) for d in global_shape)
        self.offsets = tuple(int(o) for o in offsets) if offsets is not None else \
            (0,) * len(self.global_shape)
        self.replica = bool(replica)
        if len(self.offsets) != len(self.global_shape):
            raise errors.InvalidArgumentError(
                errors.INVALID_ARGUMENT,
                f"Block: {len(self.offsets)} offsets for a global shape of "
                f"{len(self.global_shape)} dims")

    def __repr__(self):
        spans = ", ".join(f"{o}:{o + e}" for o, e in zip(self.offsets, _shape(self.tensor)))
        return f"Block([{spans}] of {list(self.global_shape)}{', replica' if self.replica else ''})"


def _shape(tensor):
    shape = getattr(tensor, "shape", None)
    return tuple(int(d) for d in shape) if shape is not None else ()


def is_dtensor(obj):
    """A torch DTensor (duck-typed: no torch import unless one is given)."""
    return (type(obj).__name__ == "DTensor" and hasattr(obj, "placements")
            and hasattr(obj, "device_mesh") and hasattr(obj, "to_local"))


def dtensor_rank_world(dt):
    """This process's rank in the DTensor's mesh (row-major over the mesh) and the mesh's size."""
    mesh = dt.device_mesh
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        raise errors.InvalidArgumentError(
            errors.INVALID_ARGUMENT, "a DTensor whose mesh does not include this process")
    sizes = tuple(int(s) for s in mesh.shape)
    rank = 0
    for c, s in zip(coordinate, sizes):
        rank = rank * s + int(c)
    return rank, math.prod(sizes)


def dtensor_block(name, dt):
    """The Block this rank holds of DTensor `dt`, or None when its shard is empty.

    Shard(d) on mesh dimension m splits dimension d (what earlier mesh dimensions left of it)
    as torch.chunk does: chunks of ceil(n / k) elements, the last ones shorter or empty.
    Replicate on m: every coordinate of m holds the same block; coordinate 0 sends it."""
    mesh = dt.device_mesh
    coordinate = [int(c) for c in mesh.get_coordinate()]
    global_shape = [int(d) for d in dt.shape]
    begin = [0] * len(global_shape)
    length = list(global_shape)
    replica = False
    for m, placement in enumerate(dt.placements):
        if placement.is_shard():
            d = placement.dim if placement.dim >= 0 else placement.dim + len(global_shape)
            k = int(mesh.size(m))
            chunk = -(-length[d] // k)
            start = min(coordinate[m] * chunk, length[d])
            begin[d] += start
            length[d] = max(0, min(chunk, length[d] - coordinate[m] * chunk))
        elif placement.is_replicate():
            replica = replica or coordinate[m] != 0
        else:
            raise errors.InvalidArgumentError(
                errors.INVALID_ARGUMENT,
                f"tensor '{name}': placement {placement} is not Shard or Replicate (a Partial "
                "DTensor holds no weights yet: reduce it first)")
    local = dt.to_local()
    if tuple(int(d) for d in local.shape) != tuple(length):
        raise errors.InvalidArgumentError(
            errors.INVALID_ARGUMENT,
            f"tensor '{name}': the local shard is {list(local.shape)}, but its placements "
            f"{list(dt.placements)} give {length}")
    if 0 in length:
        return None
    return Block(local.contiguous() if hasattr(local, "contiguous") else local, global_shape,
                 begin, replica)
