"""The memory protocol (llama_memory_i): plan a batch without touching anything, then commit
it one ubatch at a time through `MemoryContext.apply()` — the only place memory changes."""

from __future__ import annotations

from abc import ABC, abstractmethod
from enum import Enum

from ..batch import BatchAllocator, UBatch


class MemoryStatus(Enum):
    SUCCESS = "success"
    NO_UPDATE = "no update"
    FAILED_PREPARE = "failed to prepare"
    FAILED_COMPUTE = "failed to compute"


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
        """Commit the current ubatch's cells."""

    @abstractmethod
    def layer(self, il: int):
        """The attention-side view for layer `il`: `store(il, k, v)`, `kv(il)`, `mask`."""


class Memory(ABC):
    kind: str = ""

    @abstractmethod
    def init_batch(self, balloc: BatchAllocator, n_ubatch: int, embd_all: bool = False) -> MemoryContext:
        """Split the batch and find a slot for every ubatch; never mutates the memory."""

    @abstractmethod
    def clear(self) -> None: ...

    @abstractmethod
    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool: ...

    @abstractmethod
    def seq_pos_min(self, seq: int) -> int: ...

    @abstractmethod
    def seq_pos_max(self, seq: int) -> int: ...

    @property
    @abstractmethod
    def nbytes(self) -> int: ...
