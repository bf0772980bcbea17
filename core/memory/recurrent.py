"""Recurrent memory (llama_memory_recurrent): one state cell per sequence, holding per layer the
conv state (the last d_conv - 1 inputs of each channel) and the SSM state, float32.

A state summarises a sequence's whole history, so it cannot forget part of it: `seq_rm` removes a
whole sequence, or nothing, and refuses a partial removal with the reason (llama.cpp refuses it
too). It also refuses to drop only the last position, which llama.cpp answers by clearing the
whole state. Positions move without touching the state (nothing is rotated). As in llama.cpp,
a sequence's first and last position are both its state's position.
"""

from __future__ import annotations

import numpy as np

from ..batch import POS_LIMIT, UBatch
from ..statefile import StateReader, StateWriter
from .base import LoadedState, Memory, MemoryContext, MemoryStatus, open_range
from .spec import RecurrentSpec


class RecurrentMemory(Memory):
    kind = "recurrent"

    def __init__(self, layers: dict[int, RecurrentSpec], n_seq_max: int = 1, xp=np):
        self.layers, self.n_seq_max, self.xp = layers, n_seq_max, xp
        self.conv = {il: xp.zeros((n_seq_max, *s.conv_shape), dtype=np.float32) for il, s in layers.items()}
        self.ssm = {il: xp.zeros((n_seq_max, *s.ssm_shape), dtype=np.float32) for il, s in layers.items()}
        self.pos = np.full(n_seq_max, -1, dtype=np.int32)  # the position each state has seen last

    needs_equal_split = True  # a ubatch advances each of its sequences' states by the same run

    def prepare(self, ubatches: list[UBatch]) -> bool:
        """Every sequence owns its cell (the batch allocator checked the ids): a batch always fits."""
        return True

    def context(self, ubatches: list[UBatch], placement) -> "RecurrentContext":
        return RecurrentContext(self, MemoryStatus.SUCCESS, ubatches)

    # ---- sequence operations -------------------------------------------------------------

    def _reset(self, seqs) -> None:
        for store in (*self.conv.values(), *self.ssm.values()):
            store[seqs] = 0
        self.pos[seqs] = -1

    def clear(self) -> None:
        self._reset(slice(None))

    def _removal(self, seq: int, p0: int, p1: int) -> str:
        """'all' or 'none' where [p0, p1) takes the whole state or misses it; else the refusal."""
        pos = int(self.pos[seq])
        if pos < 0 or p0 > pos:
            return "none"
        if p0 <= 0 and p1 > pos:
            return "all"
        return (f"sequence {seq} is a recurrent state at position {pos}; it can be removed whole, "
                f"not positions {p0}..{'end' if p1 >= POS_LIMIT else p1 - 1}")

    def _removals(self, seq: int, p0: int, p1: int) -> dict[int, str]:
        p0, p1 = open_range(p0, p1)
        return {s: self._removal(s, p0, p1) for s in (range(self.n_seq_max) if seq < 0 else [seq])}

    def removal_refusal(self, seq: int, p0: int = -1, p1: int = -1) -> str:
        return next((what for what in self._removals(seq, p0, p1).values() if what not in ("all", "none")), "")

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        self.refusal = self.removal_refusal(seq, p0, p1)
        if self.refusal:
            return False
        self._reset([s for s, what in self._removals(seq, p0, p1).items() if what == "all"])
        return True

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """The destination gets a copy of the source's state (ranges cannot split a state)."""
        if src == dst:
            return
        for store in (*self.conv.values(), *self.ssm.values()):
            store[dst] = store[src]
        self.pos[dst] = self.pos[src]

    def seq_keep(self, seq: int) -> None:
        self._reset([s for s in range(self.n_seq_max) if s != seq])

    def _moved(self, seq: int, p0: int, p1: int) -> list[int]:
        p0, p1 = open_range(p0, p1)
        seqs = range(self.n_seq_max) if seq < 0 else [seq]
        return [s for s in seqs if p0 <= self.pos[s] < p1]

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        for s in self._moved(seq, p0, p1):
            self.pos[s] += delta
            if self.pos[s] < 0:
                self._reset([s])

    def seq_div(self, seq: int, p0: int, p1: int, d: int) -> None:
        for s in self._moved(seq, p0, p1):
            self.pos[s] //= d

    def seq_pos_min(self, seq: int) -> int:
        return int(self.pos[seq])

    @property
    def shift_refusal(self) -> str:
        """A state summarises its whole history and cannot forget part of it (llama.cpp: no context shift)."""
        return "a recurrent state summarises its whole history and cannot drop part of it"

    def seq_pos_max(self, seq: int) -> int:
        return int(self.pos[seq])

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in (*self.conv.values(), *self.ssm.values()))

    # ---- state ---------------------------------------------------------------------------

    def state_write(self, w: StateWriter, seq: int | None = None) -> None:
        w.u32(self.n_seq_max)
        w.array(np.array(sorted(self.layers), dtype=np.int32))
        seqs = list(range(self.n_seq_max)) if seq is None else [seq]
        w.array(self.pos[seqs])
        for il in sorted(self.layers):
            w.array(_host(self.conv[il][seqs]))
            w.array(_host(self.ssm[il][seqs]))

    def state_read(self, r: StateReader, seq: int | None = None) -> LoadedState:
        n_cells = r.u32("the cell count")
        if seq is None:
            r.expect("the cell count (-np)", n_cells, self.n_seq_max)
        r.expect("the recurrent layers", r.array("the layer list", np.int32).tolist(), sorted(self.layers))
        n = self.n_seq_max if seq is None else 1
        pos = r.array("the state positions", np.int32, (n,))
        if np.any((pos < -1) | (pos >= POS_LIMIT)):
            raise r.fail(f"a state position is outside -1..{POS_LIMIT - 1}")
        states = {}
        for il in sorted(self.layers):
            spec = self.layers[il]
            conv = r.array(f"layer {il} conv states", np.float32, (n, *spec.conv_shape))
            ssm = r.array(f"layer {il} ssm states", np.float32, (n, *spec.ssm_shape))
            states[il] = (conv, ssm)
        seqs = list(range(self.n_seq_max)) if seq is None else [seq]

        def commit():
            for il, (conv, ssm) in states.items():
                self.conv[il][seqs] = self.xp.asarray(conv)
                self.ssm[il][seqs] = self.xp.asarray(ssm)
            self.pos[seqs] = pos
        return LoadedState(commit, {s: int(p) for s, p in zip(seqs, pos)})


class RecurrentContext(MemoryContext):
    def __init__(self, memory: RecurrentMemory, status: MemoryStatus, ubatches=None):
        super().__init__(status, ubatches)
        self.memory = memory
        self.seqs = self.seq_index = np.empty(0, dtype=np.int64)
        self._undo = None

    def apply(self) -> None:
        """The ubatch's sequences advance to their last position here; their states are written
        by the graph through the layer views. Everything either can change is saved first."""
        ub, mem = self.ubatch, self.memory
        self.seqs, self.seq_index = np.unique(ub.seq_id, return_inverse=True)
        self._undo = (mem.pos.copy(), {il: (mem.conv[il][self.seqs], mem.ssm[il][self.seqs]) for il in mem.layers})
        for s in self.seqs:
            mem.pos[s] = ub.pos[ub.seq_id == s].max()

    def rollback(self) -> None:
        if self._undo is None:
            return
        pos, states = self._undo
        mem = self.memory
        mem.pos[:] = pos
        for il, (conv, ssm) in states.items():
            mem.conv[il][self.seqs] = conv
            mem.ssm[il][self.seqs] = ssm
        self._undo = None

    def layer(self, il: int) -> "RecurrentLayerView":
        return RecurrentLayerView(self.memory, il, self.seqs, self.seq_index)


class RecurrentLayerView:
    """Layer il's states for the ubatch's sequences (a RecurrentView)."""

    def __init__(self, memory: RecurrentMemory, il: int, seqs: np.ndarray, seq_index: np.ndarray):
        self.memory, self.il, self.seqs, self.seq_index = memory, il, seqs, seq_index

    def read(self):
        return self.memory.conv[self.il][self.seqs], self.memory.ssm[self.il][self.seqs]

    def write(self, conv, ssm) -> None:
        self.memory.conv[self.il][self.seqs] = conv
        self.memory.ssm[self.il][self.seqs] = ssm


class ScratchRecurrentView:
    """A recurrent layer without memory (the no-kv oracle): every sequence of the ubatch starts
    from the zero state, and the states after it are dropped."""

    def __init__(self, spec: RecurrentSpec, seq_id: np.ndarray, xp=np):
        self.spec, self.xp = spec, xp
        seqs, self.seq_index = np.unique(seq_id, return_inverse=True)
        self.n_seqs = len(seqs)

    def read(self):
        xp = self.xp
        return (xp.zeros((self.n_seqs, *self.spec.conv_shape), dtype=np.float32),
                xp.zeros((self.n_seqs, *self.spec.ssm_shape), dtype=np.float32))

    def write(self, conv, ssm) -> None:
        pass


def _host(a) -> np.ndarray:
    return a.get() if hasattr(a, "get") else np.asarray(a)
