"""The memory protocol (llama_memory_i): plan a batch without touching anything, then commit
it one ubatch at a time through `MemoryContext.apply()`. Sequence edits (`seq_*`) change cell
metadata at once; a position shift re-rotates cached keys lazily, in `update()`, before the
next batch."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from enum import Enum
from typing import Callable

import numpy as np

from ..batch import BatchAllocator, UBatch
from ..statefile import StateReader, StateWriter

# (layer, keys (n, n_head_kv, head_dim), position delta (n,)) -> keys rotated by the delta
KeyShifter = Callable[[int, np.ndarray, np.ndarray], np.ndarray]


class MemoryStatus(Enum):
    SUCCESS = "success"
    NO_UPDATE = "no update"
    FAILED_PREPARE = "failed to prepare"
    FAILED_COMPUTE = "failed to compute"


@dataclass
class AttnGroup:
    """Query rows of the ubatch that attend the same keys: one per cache stream."""
    rows: slice | np.ndarray
    keys: np.ndarray  # (n_kv, n_head_kv, head_dim_k)
    values: np.ndarray  # (n_kv, n_head_kv, head_dim_v)
    mask: np.ndarray  # (n_rows, n_kv): 0 keep, -inf drop
    n_kv_max: int = 0  # bound on the finite entries of any mask row (0: no promise)


@dataclass
class LoadedState:
    """A state read and checked but not applied yet: `commit()` applies it and cannot fail;
    `pos_max` is the last position each sequence holds in it (-1: none)."""
    commit: Callable[[], None]
    pos_max: dict[int, int]


class MemoryContext(ABC):
    """The plan for one batch: its ubatches and where each one goes."""

    def __init__(self, status: MemoryStatus, ubatches: list[UBatch] | None = None):
        self.status = status
        self.ubatches = ubatches or []
        self.index = 0

    @property
    def ubatch(self) -> UBatch:
        return self.ubatches[self.index]

    def next(self) -> bool:
        self.index += 1
        return self.index < len(self.ubatches)

    @abstractmethod
    def apply(self) -> None:
        """Commit the current ubatch."""

    @abstractmethod
    def layer(self, il: int):
        """Layer il's view: `store(il, k, v)` then `groups(il) -> list[AttnGroup]`."""


class Memory(ABC):
    kind: str = ""

    @abstractmethod
    def init_batch(self, balloc: BatchAllocator, n_ubatch: int) -> MemoryContext:
        """Split the batch and place every ubatch; never mutates the memory."""

    def update(self, shift_keys: KeyShifter) -> bool:
        """Apply pending work (the K-shift); True if anything changed."""
        return False

    @abstractmethod
    def clear(self) -> None: ...

    @abstractmethod
    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        """Remove positions [p0, p1) of seq (seq < 0: every sequence; negative bounds: open)."""

    @abstractmethod
    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None: ...

    @abstractmethod
    def seq_keep(self, seq: int) -> None: ...

    @abstractmethod
    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None: ...

    @abstractmethod
    def seq_div(self, seq: int, p0: int, p1: int, d: int) -> None: ...

    @abstractmethod
    def seq_pos_min(self, seq: int) -> int: ...

    @abstractmethod
    def seq_pos_max(self, seq: int) -> int: ...

    @property
    def can_shift(self) -> bool:
        return True

    @property
    @abstractmethod
    def nbytes(self) -> int: ...

    @abstractmethod
    def state_write(self, w: StateWriter, seq: int | None = None) -> None: ...

    @abstractmethod
    def state_read(self, r: StateReader, seq: int | None = None) -> LoadedState:
        """Read and check a state, deciding everything its commit needs (nothing changes before)."""


def open_range(p0: int, p1: int) -> tuple[int, int]:
    """llama.cpp's convention: a negative bound is open."""
    return (0 if p0 < 0 else p0), (np.iinfo(np.int32).max if p1 < 0 else p1)
