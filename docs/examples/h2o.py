"""H2O (Zhang et al., 2023: "H2O: Heavy-Hitter Oracle for Efficient Generative Inference of Large
Language Models") as a memory kind:  llm ... --plugin docs/examples/h2o.py --kv h2o --kv-budget 1024

Each sequence keeps its latest tokens (half the budget) and, of the older ones, the heavy hitters:
the tokens that have drawn the most attention so far. The cache reads what attention computed
through the memory's seam for it: with `observes_attention` set, the graph hands
`observe_attention` the probability each cell got after every layer. One cell serves every layer
and head here, so the score is summed over them (the paper keeps a set per head). Positions stay
the tokens' own, as in the paper; the scores travel in state files with the cells."""

import numpy as np

import llmsuite
from llmsuite.core.memory import AttnSpec, KVCache, LoadedState, attention_refusal, kv_bytes, with_recurrent

DEFAULT_BUDGET = 1024


class KeptAndWindow:
    """A query row sees the heavy hitters the cache kept and its last `recent` positions."""
    kind, uses_queries = "heavy+window", False

    def __init__(self, recent: int, budget: int):
        self.recent, self.budget = recent, budget

    def __call__(self, inp):
        xp = inp.xp
        pos, cell = xp.asarray(inp.pos)[:, None], xp.asarray(inp.cell_pos)[None, :]
        first_seen = int(inp.pos.min()) - self.recent + 1  # below it make_room left only heavy hitters
        keep = (pos - cell < self.recent) | (cell < first_seen)
        return xp.where(keep, inp.base, np.float32(-np.inf)), self.budget


class H2OCache(KVCache):
    """A stream per sequence of budget + n_ubatch cells, and the attention each cell has drawn."""
    observes_attention, fills_lowest_free = True, True

    def __init__(self, spec, p, backend):
        budget = p.kv_budget or DEFAULT_BUDGET
        self.recent = budget // 2
        self.heavy = budget - self.recent
        layers, mask = spec.of(AttnSpec), KeptAndWindow(self.recent, budget)
        super().__init__(layers, cells_per_sequence(p), p.n_seq_max, p.n_seq_max, p.type_k, p.type_v,
                         n_swa=spec.window, swa_layers=spec.window_layers, kind="h2o", backend=backend,
                         producers={il: mask for il, layer in layers.items() if layer.window == 0})
        self.score = np.zeros((p.n_seq_max, cells_per_sequence(p)), np.float32)
        self.scored = np.full(self.score.shape, -1, np.int32)  # the position a cell's score belongs to

    def seq_capacity(self):
        return None  # a sequence runs past the cache

    def observe_attention(self, il, stream, mass):
        n = len(mass)
        self.score[stream, :n] = self.scores(stream)[:n] + self.backend.to_numpy(mass)
        self.scored[stream, :n] = self.cells[stream].pos[:n]

    def extra_snapshot(self):  # a ubatch that fails takes its attention back with it
        return self.score.copy(), self.scored.copy()

    def extra_restore(self, snapshot):
        self.score[:], self.scored[:] = snapshot

    def scores(self, stream):
        """Each cell's attention so far (0 where it now holds another token than the one scored)."""
        return np.where(self.scored[stream] == self.cells[stream].pos, self.score[stream], 0)

    def make_room(self, ub):
        for seq in np.unique(ub.seq_id):
            st = self.stream_of(int(seq))
            cells, score = self.cells[st], self.scores(st)
            first_seen = int(ub.pos[ub.seq_id == seq].min()) - self.recent + 1
            older = np.flatnonzero(cells.seq[:, seq] & (cells.pos >= 0) & (cells.pos < first_seen))
            if len(older) > self.heavy:  # keep the heaviest, evict the rest
                cells.free(older[np.argsort(score[older], kind="stable")[:len(older) - self.heavy]])

    def state_write(self, w, seq=None):
        super().state_write(w, seq)
        w.array(np.concatenate([self.scores(st)[idx] for st, idx in self._held(seq)]))

    def state_read(self, r, seq=None):
        loaded, saved = super().state_read(r, seq), r.array("the attention scores", np.float32)

        def commit():
            loaded.commit()
            held = self._held(seq)
            for (st, idx), score in zip(held, np.split(saved, np.cumsum([len(i) for _, i in held])[:-1])):
                self.score[st, idx], self.scored[st, idx] = score, self.cells[st].pos[idx]
        return LoadedState(commit, loaded.pos_max)

    def _held(self, seq):
        """(stream, cells) a state of `seq` (None: of all) holds, in the order its file lists them."""
        if seq is None:
            return [(st, np.flatnonzero(cells.pos >= 0)) for st, cells in enumerate(self.cells)]
        st = self.stream_of(seq)
        return [(st, np.flatnonzero(self.cells[st].seq[:, seq]))]


def cells_per_sequence(p) -> int:
    return (p.kv_budget or DEFAULT_BUDGET) + p.n_ubatch


@llmsuite.memory_kind("h2o", budgeted=True, refuses=attention_refusal("h2o"),
                      nbytes=lambda spec, p: kv_bytes(spec, p, p.n_seq_max * cells_per_sequence(p)))
def h2o(spec, p, backend):
    if (p.kv_budget or DEFAULT_BUDGET) < 2:
        raise llmsuite.PluginError("--kv h2o splits --kv-budget between heavy hitters and recent tokens: give 2 or more")
    return with_recurrent(spec, p, backend, H2OCache(spec, p, backend))
