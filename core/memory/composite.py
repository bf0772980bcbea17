"""Memories made of memories: children that each own some of the layers and take the same
ubatches (llama.cpp's llama_kv_cache_iswa and llama_memory_hybrid are both this shape).

The composite splits a batch once, as its most demanding child needs (a recurrent child needs equal
runs per sequence), lets every child prepare those ubatches, and routes each layer's view to the
child that owns the layer. Sequence edits reach every child; a removal is first asked of every
child and done only where none refuses, so a refusal changes nothing anywhere. A sequence spans
the positions every child holds: its first position is the latest of the children's first, its
last the earliest of their last (llama.cpp combines them so). A state file holds each child's
state, tagged with its kind; a load reads and checks all of them before any is applied."""

from __future__ import annotations

from ..batch import UBatch
from ..statefile import StateReader, StateWriter
from .base import LoadedState, Memory, MemoryContext, MemoryStatus


class CompositeMemory(Memory):
    context_class = None  # a subclass's own CompositeContext (None: the plain one)

    def __init__(self, children: list[Memory]):
        self.children = tuple(children)
        self.owner = {il: child for child in self.children for il in child.layers}

    @property
    def layers(self) -> dict:
        return {il: spec for child in self.children for il, spec in child.layers.items()}

    @property
    def needs_equal_split(self) -> bool:
        return any(child.needs_equal_split for child in self.children)

    def prepare(self, ubatches: list[UBatch]):
        placements = [child.prepare(ubatches) for child in self.children]
        return None if any(p is None for p in placements) else placements

    def context(self, ubatches: list[UBatch], placements) -> "CompositeContext":
        parts = [child.context(ubatches, p) for child, p in zip(self.children, placements)]
        return (self.context_class or CompositeContext)(self, ubatches, parts)

    def update(self, backend) -> bool:
        return any([child.update(backend) for child in self.children])

    def clear(self) -> None:
        for child in self.children:
            child.clear()

    def removal_refusal(self, seq: int, p0: int = -1, p1: int = -1) -> str:
        return next((r for child in self.children if (r := child.removal_refusal(seq, p0, p1))), "")

    def start_refusal(self, seq: int, pos: int) -> str:
        return next((r for child in self.children if (r := child.start_refusal(seq, pos))), "")

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        self.refusal = self.removal_refusal(seq, p0, p1)
        if self.refusal:
            return False
        return all([child.seq_rm(seq, p0, p1) for child in self.children])

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        for child in self.children:
            child.seq_cp(src, dst, p0, p1)

    @property
    def copy_refusal(self) -> str:
        return next((r for child in self.children if (r := child.copy_refusal)), "")

    def seq_keep(self, seq: int) -> None:
        for child in self.children:
            child.seq_keep(seq)

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        for child in self.children:
            child.seq_add(seq, p0, p1, delta)

    def seq_div(self, seq: int, p0: int, p1: int, d: int) -> None:
        for child in self.children:
            child.seq_div(seq, p0, p1, d)

    def seq_pos_min(self, seq: int) -> int:
        return max(child.seq_pos_min(seq) for child in self.children)

    def seq_pos_max(self, seq: int) -> int:
        return min(child.seq_pos_max(seq) for child in self.children)

    def seq_capacity(self) -> int | None:
        bounds = [c for c in (child.seq_capacity() for child in self.children) if c is not None]
        return min(bounds, default=None)

    @property
    def shift_refusal(self) -> str:
        return next((r for child in self.children if (r := child.shift_refusal)), "")

    @property
    def nbytes(self) -> int:
        return sum(child.nbytes for child in self.children)

    def state_write(self, w: StateWriter, seq: int | None = None) -> None:
        for child in self.children:
            w.str(child.kind)
            child.state_write(w, seq)

    def state_read(self, r: StateReader, seq: int | None = None) -> LoadedState:
        """Every child's state is read and placed before any is written, so a load applies whole or
        not at all; the children must end every sequence at the same position."""
        loaded = []
        for child in self.children:
            r.expect("the memory kind of a part", r.str("the memory kind of a part"), child.kind)
            loaded.append(child.state_read(r, seq))
        first = loaded[0]
        for child, state in zip(self.children[1:], loaded[1:]):
            if state.pos_max != first.pos_max:
                raise r.fail(f"its {self.children[0].kind} and {child.kind} parts end at different positions")

        def commit():
            for state in loaded:
                state.commit()
        return LoadedState(commit, first.pos_max)


class CompositeContext(MemoryContext):
    """One context per child, moved through the ubatches together; a layer's view comes from the
    context of the child that owns the layer."""

    def __init__(self, memory: CompositeMemory, ubatches: list[UBatch], parts: list[MemoryContext]):
        super().__init__(MemoryStatus.SUCCESS, ubatches)
        self.memory = memory
        self.parts = dict(zip(memory.children, parts))

    def next(self) -> bool:
        for part in self.parts.values():
            part.next()
        return super().next()

    def apply(self) -> None:
        for part in self.parts.values():
            part.apply()

    def rollback(self) -> None:
        for part in reversed(list(self.parts.values())):
            part.rollback()

    def layer(self, il: int):
        return self.parts[self.memory.owner[il]].layer(il)


class HybridMemory(CompositeMemory):
    """llama_memory_hybrid: an attention memory (unified, split or iSWA) for the attention layers
    and a recurrent memory for the recurrent ones.

    Positions move in both children: the attention child re-rotates its keys (the K-shift, lazily
    in update()), the recurrent states only record where they are. A context shift, which drops the
    middle of a sequence, is refused: a recurrent state cannot forget part of its history."""
    kind = "hybrid"

    def __init__(self, attention: Memory, recurrent: Memory):
        super().__init__([attention, recurrent])
        self.attention, self.recurrent = attention, recurrent

    @property
    def shift_refusal(self) -> str:
        if self.attention.shift_refusal:
            return self.attention.shift_refusal
        return (f"its recurrent layers ({_layer_list(self.recurrent.layers)}) hold states that summarise the whole "
                "sequence and cannot drop part of it")


def _layer_list(layers) -> str:
    ids = sorted(layers)
    return ", ".join(map(str, ids)) if len(ids) <= 8 else f"{len(ids)} layers"
