"""StreamingLLM (Xiao et al., 2023: "Efficient Streaming Language Models with Attention Sinks") as a
memory kind:  llm generate --plugin docs/examples/streaming_llm.py --kv streaming --kv-budget 1024 ...

Each sequence keeps its first N_SINK tokens (the attention sinks) and its latest ones, --kv-budget
cells in all; the middle is evicted as the sequence moves on, so a context runs past its cache with
nothing recomputed. Positions are those within the cache, as in the paper: before each ubatch the
sinks move to sit just before the oldest position its first token still sees, so every query finds
them at the distance a compacted cache would give (RoPE sees only distances). The layers of a
sliding-window model keep their own window."""

import numpy as np

import llmsuite
from llmsuite.core.memory import AttnSpec, KVCache, attention_refusal, kv_bytes, with_recurrent

N_SINK = 4
DEFAULT_BUDGET = 1024


class SinksAndWindow:
    """A query row keeps the sinks and its last `window` positions: N_SINK + window cells at most."""
    kind, uses_queries = "sinks+window", False

    def __init__(self, window: int):
        self.window = window

    def __call__(self, inp):
        xp = inp.xp
        pos, cell = xp.asarray(inp.pos)[:, None], xp.asarray(inp.cell_pos)[None, :]
        first_seen = int(inp.pos.min()) - self.window + 1  # below it make_room left only the sinks
        keep = (pos - cell < self.window) | (cell < first_seen)
        return xp.where(keep, inp.base, np.float32(-np.inf)), N_SINK + self.window


class StreamingCache(KVCache):
    """A stream per sequence of budget + n_ubatch cells: room for a ubatch beside what it sees."""
    fills_lowest_free = True

    def __init__(self, spec, p, backend):
        self.window = (p.kv_budget or DEFAULT_BUDGET) - N_SINK
        layers, mask = spec.of(AttnSpec), SinksAndWindow(self.window)
        super().__init__(layers, cells_per_sequence(p), p.n_seq_max, p.n_seq_max, p.type_k, p.type_v,
                         n_swa=spec.window, swa_layers=spec.window_layers, kind="streaming", backend=backend,
                         producers={il: mask for il, layer in layers.items() if layer.window == 0})

    def seq_capacity(self):
        return None  # a sequence runs past the cache

    def make_room(self, ub):
        for seq in np.unique(ub.seq_id):
            cells = self.cells[self.stream_of(int(seq))]
            first_seen = int(ub.pos[ub.seq_id == seq].min()) - self.window + 1
            held = np.flatnonzero(cells.seq[:, seq])
            held = held[np.argsort(cells.pos[held])]
            sinks, rest = held[:N_SINK], held[N_SINK:]
            cells.free(rest[cells.pos[rest] < first_seen])  # out of every later token's window
            move = first_seen - len(sinks) - int(cells.pos[sinks[0]]) if len(sinks) else 0
            if move > 0:  # a shift: the cache re-rotates the sinks' keys before the ubatch attends
                cells.pos[sinks] += move
                cells.shift[sinks] += move


def cells_per_sequence(p) -> int:
    return (p.kv_budget or DEFAULT_BUDGET) + p.n_ubatch


@llmsuite.memory_kind("streaming", budgeted=True, refuses=attention_refusal("streaming"),
                      nbytes=lambda spec, p: kv_bytes(spec, p, p.n_seq_max * cells_per_sequence(p)))
def streaming(spec, p, backend):
    if (p.kv_budget or DEFAULT_BUDGET) <= N_SINK:
        raise llmsuite.PluginError(f"--kv streaming keeps {N_SINK} sinks: --kv-budget must exceed it")
    return with_recurrent(spec, p, backend, StreamingCache(spec, p, backend))
