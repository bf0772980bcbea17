"""The memory protocol (llama_memory_i): plan a batch without touching anything, then commit
it one ubatch at a time through `MemoryContext.apply()`, which `rollback()` undoes exactly.
Sequence edits (`seq_*`) change cell metadata at once; a position shift re-rotates cached keys
lazily, in `update()`, before the next batch.

The graph reaches a layer's memory through `MemoryContext.layer(il)`: an `AttnView` for an
attention layer, a `RecurrentView` for a recurrent one."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import Enum
from typing import Callable, Protocol

import numpy as np

from ..batch import BatchAllocator, UBatch
from ..statefile import StateReader, StateWriter
from .masks import CausalMask, MaskInput, MaskProducer


class MemoryStatus(Enum):
    SUCCESS = "success"
    NO_UPDATE = "no update"
    FAILED_PREPARE = "failed to prepare"
    FAILED_COMPUTE = "failed to compute"


@dataclass
class AttnGroup:
    """Query rows of the ubatch that attend the same keys (one per cache stream), with what the
    layer's mask producer needs: the base mask, the query and cell positions, and extra stores."""
    rows: slice | np.ndarray
    keys: np.ndarray  # (n_kv, n_head_kv, head_dim_k)
    values: np.ndarray  # (n_kv, n_head_kv, head_dim_v)
    mask: np.ndarray  # (n_rows, n_kv) causal and sequence mask: 0 keep, -inf drop
    pos: np.ndarray  # (n_rows,) query positions
    cell_pos: np.ndarray  # (n_kv,) cell positions (-1: empty)
    producer: MaskProducer = field(default_factory=CausalMask)
    extra: dict = field(default_factory=dict)  # what the producer reads besides (e.g. "bounds")
    # where the memory keeps attention statistics (Memory.observes_attention): called after the
    # layer's attention with the probability each of these cells got, summed over rows and heads
    observe: Callable[[np.ndarray], None] | None = None

    def produce_mask(self, il: int, q, backend=None, queries: dict | None = None) -> tuple[np.ndarray, int]:
        """(mask, n_kv_max) for these rows' queries q, by the layer's producer (with the backend's
        fused mask ops where it has them); `queries` adds per-row inputs of the producer (the
        indexer's queries and weights). Without a backend: NumPy array operations."""
        extra = self.extra if not queries else {**self.extra, **queries}
        xp = np if backend is None else backend.xp
        return self.producer(MaskInput(il, q, self.mask, self.pos, self.cell_pos, xp, extra, backend))


class AttnView(Protocol):
    """An attention layer's door to the memory, for the current ubatch."""

    def store(self, k: np.ndarray, v: np.ndarray | None = None, **extra) -> None:
        """Keep the ubatch's K/V rows (n_tokens, n_head_kv, head_dim); v None where V is a view of
        K; extra stores by name (`indexer_k`)."""

    def groups(self) -> list[AttnGroup]:
        """The keys each group of query rows attends, with its base mask and mask producer."""


class RecurrentView(Protocol):
    """A recurrent layer's door to the memory: the states of the ubatch's sequences, in the order
    of `seq_index` (the ubatch token → state row map)."""

    seq_index: np.ndarray  # (n_tokens,) row of each token's sequence in read()'s arrays

    def read(self) -> tuple[np.ndarray, np.ndarray]:
        """(conv (n_seqs, d_conv - 1, channels), ssm (n_seqs, *ssm_shape)), fresh arrays."""

    def write(self, conv: np.ndarray, ssm: np.ndarray) -> None:
        """The states after the ubatch, same shapes as read()'s."""


class BoundAttnView:
    """Layer il of a context whose `store(il, k, v)` and `groups(il)` serve every attention layer."""

    def __init__(self, mctx, il: int):
        self.mctx, self.il = mctx, il

    def store(self, k: np.ndarray, v: np.ndarray | None = None, **extra) -> None:
        self.mctx.store(self.il, k, v, **extra)

    def groups(self) -> list[AttnGroup]:
        return self.mctx.groups(self.il)


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
    def rollback(self) -> None:
        """Undo the last apply() and what the graph then wrote: the memory is exactly as before it."""

    @abstractmethod
    def layer(self, il: int) -> AttnView | RecurrentView:
        """Layer il's view for the current ubatch."""


class FailedContext(MemoryContext):
    """A batch that does not fit: nothing to apply."""

    def __init__(self):
        super().__init__(MemoryStatus.FAILED_PREPARE)

    def apply(self) -> None:
        raise RuntimeError("the batch did not fit the memory: nothing to apply")

    def rollback(self) -> None:
        pass

    def layer(self, il: int):
        raise RuntimeError("the batch did not fit the memory: no layer views")


class Memory(ABC):
    """A memory owns some layers (`layers`: layer → spec) and plans each batch in three steps:
    `split` it into ubatches, `prepare` a placement of all of them without changing anything, then
    hand both to `context`, whose apply() commits one ubatch at a time. A composite memory
    (composite.py) splits once and lets every child prepare the same ubatches."""
    kind: str = ""
    layers: dict = {}

    # True where ubatches must take equal runs of tokens from each of their sequences (a recurrent
    # state advances one sequence per row; per-sequence streams write one stream per row)
    needs_equal_split: bool = False

    def split(self, balloc: BatchAllocator, n_ubatch: int) -> list[UBatch]:
        return balloc.split_equal(n_ubatch) if self.needs_equal_split else balloc.split_simple(n_ubatch)

    @abstractmethod
    def prepare(self, ubatches: list[UBatch]):
        """Where every ubatch would go, in order (None: they do not all fit); changes nothing."""

    @abstractmethod
    def context(self, ubatches: list[UBatch], placement) -> MemoryContext:
        """The context that applies `ubatches` where `prepare` placed them."""

    def init_batch(self, balloc: BatchAllocator, n_ubatch: int) -> MemoryContext:
        """Split the batch and place every ubatch; never mutates the memory."""
        ubatches = self.split(balloc, n_ubatch)
        placement = self.prepare(ubatches)
        return FailedContext() if placement is None else self.context(ubatches, placement)

    # what a failed partial seq_rm says, for the caller's message
    refusal: str = ""

    # True where the memory reads what attention computed (an H2O-style policy): the graph then
    # computes each cell's attention mass after every layer and calls observe_attention with it
    observes_attention: bool = False

    def observe_attention(self, il: int, stream: int, mass) -> None:
        """Layer il's attention over the first len(mass) cells of `stream` gave them this mass
        (probabilities summed over the ubatch's rows and the heads); an array of the backend's."""

    def removal_refusal(self, seq: int, p0: int = -1, p1: int = -1) -> str:
        """Why seq_rm(seq, p0, p1) would be refused ("": it would not); changes nothing."""
        return ""

    def start_refusal(self, seq: int, pos: int) -> str:
        """Why an empty sequence cannot start at `pos` ("": it can)."""
        return ""

    def update(self, backend) -> bool:
        """Apply pending work (the K-shift, with `backend`'s rope); True if anything changed."""
        return False

    @abstractmethod
    def clear(self) -> None: ...

    @abstractmethod
    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        """Remove positions [p0, p1) of seq (seq < 0: every sequence; negative bounds: open).
        False, with the reason in `refusal` and nothing changed, where the memory cannot."""

    @abstractmethod
    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None: ...

    @property
    def copy_refusal(self) -> str:
        """Why this memory cannot copy a whole sequence into another with seq_cp ("": it can), a
        sentence; the tools that share a prompt (batched-bench -pps) ask before decoding."""
        return ""

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

    def seq_capacity(self) -> int | None:
        """Cells one sequence can hold, or None where this memory sets no bound of its own (the
        context's size bounds it then)."""
        return None

    @property
    def can_shift(self) -> bool:
        """A context shift (drop part of a sequence, move the rest down) can be done."""
        return not self.shift_refusal

    @property
    def shift_refusal(self) -> str:
        """Why this memory cannot do a context shift ("": it can), ending a sentence that starts
        "--context-shift drops the middle of a sequence and moves the rest down; ..."."""
        return ""

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
