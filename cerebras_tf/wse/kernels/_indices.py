"""Index checks of TF's CPU kernels: an index out of range raises KernelInputError in TF's words.

TF's CPU kernels (GatherV2, ResourceGather, ResourceScatterAdd, UnsortedSegmentSum, ResourceSparseApply*)
refuse an index outside [0, limit) with InvalidArgumentError; numpy would wrap a negative index around and
raise a bare IndexError for a large one. The check is one vectorised pass: viewed as unsigned, a negative
index is larger than any limit, so one max() finds both kinds. Only when it fails is the offending position
looked for: the first in row-major order, which is what TF names (for large inputs with several bad indices,
TF's sharded kernel may name a later one: whichever shard reports last). A kernel in a tf.cond branch not taken
this step refuses nothing (TF does not run it): a gather reads `clamped` indices instead.
"""
from __future__ import annotations

import numpy as np

from cerebras_tf.wse.kernels._registry import KernelInputError


def _all_below(indices: np.ndarray, limit: int) -> bool:
    """Whether every index lies in [0, limit), in one pass over the indices."""
    kind = indices.dtype.kind
    if kind == "i":
        return int(indices.view(np.dtype(f"u{indices.dtype.itemsize}")).max()) < limit
    if kind == "u":
        return int(indices.max()) < limit
    return bool(indices.min() >= 0) and bool(indices.max() < limit)


def first_out_of_range(indices: np.ndarray, limit: int, negatives_dropped: bool = False) -> int | None:
    """The flat (row-major) position of the first index outside [0, limit), None when there is none.
    negatives_dropped: only indices >= limit count (UnsortedSegmentSum drops negative segment ids)."""
    indices = np.asarray(indices)
    if indices.size == 0:
        return None
    if negatives_dropped:
        if int(indices.max()) < limit:
            return None
        return int(np.argmax(indices.reshape(-1) >= limit))
    if _all_below(indices, limit):
        return None
    flat = indices.reshape(-1)
    return int(np.argmax((flat < 0) | (flat >= limit)))


def clamped(indices: np.ndarray, limit: int) -> np.ndarray:
    """The indices with those outside [0, limit) moved to the nearer end (the array itself when all are in range):
    what a kernel in an untaken tf.cond branch reads instead of refusing them (limit >= 1)."""
    indices = np.asarray(indices)
    if indices.size == 0 or _all_below(indices, limit):
        return indices
    return np.clip(indices, 0, limit - 1)


def where(shape: tuple[int, ...], flat: int) -> str:
    """TF's SliceDebugString: "" for a scalar, "[i]" or "[i,j,...]" for the position `flat`."""
    if not shape:
        return ""
    return "[" + ",".join(str(int(i)) for i in np.unravel_index(flat, shape)) + "]"


def check_indices(indices: np.ndarray, limit: int) -> None:
    """GatherV2 / ResourceGather / ResourceScatterAdd: "indices[1,2] = 7 is not in [0, 5)"."""
    indices = np.asarray(indices)
    bad = first_out_of_range(indices, limit)
    if bad is not None:
        value = int(indices.reshape(-1)[bad])
        raise KernelInputError(f"indices{where(indices.shape, bad)} = {value} is not in [0, {limit})")


def check_segment_ids(ids: np.ndarray, num_segments: int) -> None:
    """UnsortedSegmentSum (negative ids are dropped, not refused): "segment_ids[2] = 7 is out of range [0, 5)"."""
    ids = np.asarray(ids)
    bad = first_out_of_range(ids, num_segments, negatives_dropped=True)
    if bad is not None:
        value = int(ids.reshape(-1)[bad])
        raise KernelInputError(f"segment_ids{where(ids.shape, bad)} = {value} is out of range [0, {num_segments})")


def check_sparse_apply_indices(indices: np.ndarray, limit: int) -> None:
    """ResourceSparseApply* (indices a vector): "Index 7 at offset 1 in indices is out of range"."""
    indices = np.asarray(indices)
    bad = first_out_of_range(indices, limit)
    if bad is not None:
        raise KernelInputError(f"Index {int(indices.reshape(-1)[bad])} at offset {bad} in indices is out of range")
