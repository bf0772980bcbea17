"""`Context`: a model plus its memory; `decode` runs batches the way llama_decode does."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from enum import IntEnum

import numpy as np

from .backend import get_backend
from .batch import Batch, BatchAllocator
from .errors import InvalidInputError
from .graph import Graph
from .memory import MemoryStatus
from .models.base import MemoryParams, Model


class DecodeStatus(IntEnum):
    """llama_decode's return codes."""
    OK = 0
    NO_SLOT = 1
    ABORTED = 2
    INVALID_BATCH = -1
    COMPUTE_FAILED = -3


@dataclass
class ContextParams:
    n_ctx: int = 0  # 0: the model's training context
    n_batch: int = 2048
    n_ubatch: int = 512
    n_seq_max: int = 1
    type_k: str = "f32"
    type_v: str = "f32"
    swa_full: bool = False
    backend: str = "cpu"

    def validate(self) -> None:
        """Refuse flag combinations that cannot work (before any model is loaded)."""
        if self.n_ctx < 0:
            raise InvalidInputError("-c must be 0 (the model's context) or a positive size")
        if self.n_ubatch <= 0 or self.n_batch <= 0:
            raise InvalidInputError("-b and -ub must be positive")
        if self.n_ubatch > self.n_batch:
            raise InvalidInputError(f"the micro-batch (-ub {self.n_ubatch}) cannot exceed the batch (-b {self.n_batch})")
        if self.n_seq_max < 1:
            raise InvalidInputError("the context needs room for at least one sequence (-np >= 1)")


@dataclass
class PerfCounters:
    """llama.cpp's accounting: a decode of one token is an eval run, of more a prompt eval."""
    t_start: float = field(default_factory=time.perf_counter)
    t_p_eval: float = 0.0
    n_p_eval: int = 0
    t_eval: float = 0.0
    n_eval: int = 0

    def add(self, n_tokens: int, seconds: float) -> None:
        if n_tokens == 1:
            self.t_eval += seconds
            self.n_eval += 1
        else:
            self.t_p_eval += seconds
            self.n_p_eval += n_tokens


class Context:
    def __init__(self, model: Model, params: ContextParams | None = None, observer=None):
        params = replace(params) if params else ContextParams()
        params.validate()
        hp = model.hparams
        if params.n_ctx == 0:
            params.n_ctx = hp.n_ctx_train
        params.n_batch = min(params.n_batch, params.n_ctx)
        params.n_ubatch = min(params.n_ubatch, params.n_batch)
        self.model, self.params = model, params
        self.backend = get_backend(params.backend)
        self.memory = model.create_memory(MemoryParams(
            n_ctx=params.n_ctx, n_ubatch=params.n_ubatch, n_seq_max=params.n_seq_max,
            type_k=params.type_k, type_v=params.type_v, swa_full=params.swa_full))
        self.balloc = BatchAllocator(hp.n_vocab, params.n_seq_max)
        self.logits = np.empty((0, hp.n_vocab), dtype=np.float32)
        self.output_ids = np.empty(0, dtype=np.int64)  # batch index → logits row (-1: no output)
        self.perf = PerfCounters()
        self.last_error = ""
        self.observer = observer  # observer(name, ubatch, tensor) sees named intermediates

    @property
    def n_ctx(self) -> int:
        return self.params.n_ctx

    def decode(self, batch: Batch) -> DecodeStatus:
        """Run a batch; on failure memory is as before (or, mid-batch, keeps the ubatches done)."""
        t0 = time.perf_counter()
        self.last_error = ""
        if len(batch) > self.params.n_batch:
            return self._fail(DecodeStatus.INVALID_BATCH,
                              f"the batch has {len(batch)} tokens, more than -b {self.params.n_batch}")
        try:
            self.balloc.init(batch, self.memory)
        except InvalidInputError as e:
            return self._fail(DecodeStatus.INVALID_BATCH, str(e))
        mctx = self.memory.init_batch(self.balloc, self.params.n_ubatch)
        if mctx.status != MemoryStatus.SUCCESS:
            return self._fail(DecodeStatus.NO_SLOT, f"no room in the context ({self.n_ctx} cells) for the batch")
        n_outputs = int(self.balloc.output.sum())
        logits = np.empty((n_outputs, self.model.hparams.n_vocab), dtype=np.float32)
        output_ids = np.full(len(batch), -1, dtype=np.int64)
        row = 0
        while True:
            ub = mctx.ubatch
            try:
                mctx.apply()
                out = self.model.forward(Graph(self.model, mctx, self.backend, self.observer))
            except KeyboardInterrupt:
                self._roll_back(ub)
                return self._fail(DecodeStatus.ABORTED, "interrupted")
            except (MemoryError, FloatingPointError) as e:
                self._roll_back(ub)
                return self._fail(DecodeStatus.COMPUTE_FAILED, f"compute failed: {e}")
            except Exception:
                self._roll_back(ub)  # a bug: keep memory consistent, then surface it
                raise
            n_out = ub.n_outputs
            logits[row:row + n_out] = out
            output_ids[ub.batch_idx[ub.output]] = np.arange(row, row + n_out)
            row += n_out
            if not mctx.next():
                break
        self.logits, self.output_ids = logits, output_ids
        self.perf.add(len(batch), time.perf_counter() - t0)
        return DecodeStatus.OK

    def _roll_back(self, ub) -> None:
        """Remove the failed ubatch's positions; earlier ubatches stay (llama.cpp's rule)."""
        for seq, (p0, _) in ub.seq_pos_range().items():
            self.memory.seq_rm(seq, p0, -1)

    def _fail(self, status: DecodeStatus, message: str) -> DecodeStatus:
        self.last_error = message
        return status

    def get_logits(self, i: int = -1) -> np.ndarray:
        """Logits of batch index i of the last decode (-1: the last output)."""
        if i < 0:
            if len(self.logits) == 0:
                raise InvalidInputError("the last batch produced no logits")
            return self.logits[-1]
        row = self.output_ids[i] if i < len(self.output_ids) else -1
        if row < 0:
            raise InvalidInputError(f"batch index {i} did not request logits")
        return self.logits[row]
