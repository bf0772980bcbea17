"""`Context`: a model plus its memory; `decode` runs batches the way llama_decode does, `encode`
runs an encoder the way llama_encode does, and the state (memory plus the tokens it holds, and an
encoder-decoder's encoder output) can be saved and loaded whole or per sequence.

Context kinds (`--ctx`): a causal `decoder` over a memory, `no-kv` (a decoder without a cache),
`encoder` (no memory; embeddings, pooled per sequence) and `enc-dec` (the encoder's output is
kept for the decoder's cross-attention)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from enum import IntEnum
from pathlib import Path

import numpy as np

from .backend import NUMERICS, get_backend
from .batch import Batch, BatchAllocator
from .cross import CrossInput
from .embeddings import POOLING_NAMES, pool
from .errors import InvalidInputError, excerpt
from .graph import AttnStats, Graph
from .memory import MemoryParams, MemoryStatus, resolve_kinds
from .memory.batch_only import BatchOnlyContext
from .models.base import Model
from .statefile import StateFileError, StateReader, StateWriter
from .threads import use_threads

STATE_MAGIC, SEQ_STATE_MAGIC = b"LLMSTATE", b"LLMSEQST"
# A state file: magic, version, architecture, model fingerprint, memory kind, the tokens (for
# --prompt-cache: sequence 0's, or the saved sequence's, at positions 0..n-1), the memory's own
# fields, and a CRC-32 of all that. Keys are stored rotated to the positions recorded: a pending
# K-shift is applied before writing, so no shift is saved.
STATE_VERSION = 3
ATTN_PATHS = ("auto", "dense", "sparse")


class DecodeStatus(IntEnum):
    """llama_decode's return codes."""
    OK = 0
    NO_SLOT = 1
    ABORTED = 2
    INVALID_BATCH = -1
    COMPUTE_FAILED = -3


@dataclass
class ContextParams(MemoryParams):
    """What a context is built with: the memory's parameters plus batching and the backend."""
    n_batch: int = 2048
    backend: str = "cpu"
    numerics: str | None = None  # None: the backend's default when the context is built (ggml on the cpu, f32 on cuda)
    embeddings: bool = False  # outputs are hidden states (per token, or pooled), not logits
    pooling: str = "auto"  # auto: the model's pooling type
    n_threads: int = 0  # -t: CPU threads for a one-token step (0: as they are)
    n_threads_batch: int = 0  # -tb: for larger batches (0: as -t)

    def validate(self) -> None:
        """Refuse flag values that cannot work whatever the model (checked before loading one)."""
        if self.n_threads < 0 or self.n_threads_batch < 0:
            raise InvalidInputError("-t and -tb take a thread count (0: all cores)")
        if self.n_ctx < 0:
            raise InvalidInputError("-c must be 0 (the model's context) or a positive size")
        if self.n_ubatch <= 0 or self.n_batch <= 0:
            raise InvalidInputError("-b and -ub must be positive")
        if self.n_ubatch > self.n_batch:
            raise InvalidInputError(f"the micro-batch (-ub {self.n_ubatch}) cannot exceed the batch (-b {self.n_batch})")
        if self.numerics is not None and self.numerics not in NUMERICS:
            raise InvalidInputError(f"unknown --numerics '{self.numerics}' (choose from {', '.join(NUMERICS)})")
        if self.attn not in ATTN_PATHS:
            raise InvalidInputError(f"unknown --attn '{self.attn}' (choose from {', '.join(ATTN_PATHS)})")
        if self.pooling not in ("auto", *POOLING_NAMES):
            raise InvalidInputError(f"unknown --pooling '{self.pooling}' (choose from {', '.join(POOLING_NAMES)})")
        self.validate_flags()


@dataclass
class PerfCounters:
    """llama.cpp's accounting: a generation step (one token, or one per sequence with -np) is an
    eval run; any other batch is prompt eval, counted in tokens."""
    t_start: float = field(default_factory=time.perf_counter)
    t_p_eval: float = 0.0
    n_p_eval: int = 0
    t_eval: float = 0.0
    n_eval: int = 0

    def add(self, n_tokens: int, seconds: float, step: bool = False) -> None:
        if n_tokens == 1 or step:
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
        if params.backend != model.backend.name:
            raise InvalidInputError(f"the model was loaded for the {model.backend.name} backend, not {params.backend}")
        self.model, self.params = model, params
        self.backend = get_backend(params.backend, params.attn, params.numerics)
        self.attn_impl = model.resolve_attn_impl(params)
        _, self.kind = resolve_kinds(model.arch, model.memory_spec(self.attn_impl), params)
        self.memory = None if self.kind == "encoder" else model.create_memory(params, self.backend.xp)
        self.embeddings = params.embeddings or self.kind == "encoder"
        self.pooling = params.pooling if params.pooling != "auto" else (hp.pooling or "none")
        if params.embeddings and self.kind == "enc-dec":
            raise InvalidInputError(f"embeddings of an encoder-decoder model ({model.arch}) are not supported, "
                                    "as in llama.cpp")
        self.cross: CrossInput | None = None  # the last encode's output (enc-dec)
        self.balloc = BatchAllocator(hp.n_vocab, params.n_seq_max)
        self._logits_store: np.ndarray | None = None
        self.logits = np.empty((0, self.output_width), dtype=np.float32)  # or embeddings, per output row
        self.output_ids = np.empty(0, dtype=np.int64)  # batch index → logits row (-1: no output)
        self.embd_seq: dict[int, np.ndarray] = {}  # pooled embeddings of the last batch's sequences
        self.perf = PerfCounters()
        self.last_error = ""
        self.observer = observer  # observer(name, ubatch, tensor) sees named intermediates
        self.attn_stats: AttnStats | None = None  # set one to count and time attention per layer (-v)

    @property
    def n_ctx(self) -> int:
        return self.params.n_ctx

    @property
    def output_width(self) -> int:
        hp = self.model.hparams
        return hp.n_embd if self.embeddings else hp.n_vocab

    # ---- decoding ------------------------------------------------------------------------

    def decode(self, batch: Batch) -> DecodeStatus:
        """Run a batch; on failure the memory is as before the failed ubatch (the ubatches done
        before it stay, as in llama.cpp): the memory context rolls that ubatch back."""
        if self.memory is None:  # an encoder: llama_decode forwards to llama_encode
            return self.encode(batch)
        t0 = time.perf_counter()
        self.last_error = ""
        self._invalidate_outputs()
        if len(batch) > self.params.n_batch:
            return self._fail(DecodeStatus.INVALID_BATCH,
                              f"the batch has {len(batch)} tokens, more than -b {self.params.n_batch}")
        if self.kind == "enc-dec" and self.cross is None:
            return self._fail(DecodeStatus.INVALID_BATCH, f"{self.model.arch}'s decoder needs an encoded input: "
                                                          "encode before decoding")
        try:
            self.balloc.init(batch, self.memory, output_all=self.embeddings)
        except InvalidInputError as e:
            return self._fail(DecodeStatus.INVALID_BATCH, str(e))
        if self.backend.name == "cpu":  # llama.cpp: -t for a one-token step, -tb for batches
            p = self.params
            use_threads(p.n_threads if len(batch) == 1 else (p.n_threads_batch or p.n_threads))
        self.memory.update(self.backend)
        mctx = self.memory.init_batch(self.balloc, self.params.n_ubatch)
        if mctx.status != MemoryStatus.SUCCESS:
            return self._fail(DecodeStatus.NO_SLOT, f"no room in the context ({self.n_ctx} cells) for the batch")
        out_pos = np.full(len(batch), -1, dtype=np.int64)  # batch index → logits row, in batch order
        n_outputs = int(self.balloc.output.sum())
        out_pos[self.balloc.output] = np.arange(n_outputs)
        logits = self._logits_buffer(n_outputs)
        while True:
            ub = mctx.ubatch
            try:
                mctx.apply()
                rows = out_pos[ub.batch_idx[ub.output]]
                contiguous = len(rows) > 0 and bool(np.all(np.diff(rows) == 1))
                target = logits[rows[0]:rows[-1] + 1] if contiguous else None
                out = self.model.forward(Graph(self.model, mctx, self.backend, self.observer, target,
                                                stats=self.attn_stats, embeddings=self.embeddings,
                                                cross=self.cross, attn_impl=self.attn_impl))
                if not contiguous:
                    logits[self.backend.asarray(rows)] = out
            except KeyboardInterrupt:
                mctx.rollback()
                return self._fail(DecodeStatus.ABORTED, "interrupted")
            except (MemoryError, FloatingPointError) as e:
                mctx.rollback()
                return self._fail(DecodeStatus.COMPUTE_FAILED, f"compute failed: {e}")
            except Exception:
                mctx.rollback()  # a bug: keep memory consistent, then surface it
                raise
            if not mctx.next():
                break
        self._set_outputs(logits, out_pos)
        one_per_sequence = len(np.unique(self.balloc.seq_id)) == len(batch)
        self.perf.add(len(batch), time.perf_counter() - t0, step=one_per_sequence)
        return DecodeStatus.OK

    def encode(self, batch: Batch) -> DecodeStatus:
        """Run the encoder over a batch in one micro-batch, each sequence attending all of its own
        tokens. An encoder context then holds the embeddings; an encoder-decoder one keeps the
        output for its decoder (replacing the last encode's)."""
        t0 = time.perf_counter()
        self.last_error = ""
        self._invalidate_outputs()
        if self.kind not in ("encoder", "enc-dec"):
            return self._fail(DecodeStatus.INVALID_BATCH, f"{self.model.arch} has no encoder")
        if len(batch) > self.params.n_ubatch:
            return self._fail(DecodeStatus.INVALID_BATCH, f"the encoder takes a batch in one micro-batch: "
                                                          f"{len(batch)} tokens, more than -ub {self.params.n_ubatch}")
        try:
            self.balloc.init(batch, None, output_all=True)
        except InvalidInputError as e:
            return self._fail(DecodeStatus.INVALID_BATCH, str(e))
        ub = self.balloc.split_simple(len(batch))[0]
        mctx = BatchOnlyContext(ub, causal=False, xp=self.backend.xp)
        target = self._logits_buffer(len(batch)) if self.kind == "encoder" else None
        try:
            out = self.model.encode(Graph(self.model, mctx, self.backend, self.observer, target, embeddings=True))
        except KeyboardInterrupt:
            return self._fail(DecodeStatus.ABORTED, "interrupted")
        except InvalidInputError as e:
            return self._fail(DecodeStatus.INVALID_BATCH, str(e))
        except (MemoryError, FloatingPointError) as e:
            return self._fail(DecodeStatus.COMPUTE_FAILED, f"compute failed: {e}")
        if self.kind == "enc-dec":
            self.cross = CrossInput(out, ub.seq_id, self.backend.xp)
        else:
            self._set_outputs(out, np.arange(len(batch)))
        self.perf.add(len(batch), time.perf_counter() - t0)
        return DecodeStatus.OK

    def _set_outputs(self, rows: np.ndarray, out_pos: np.ndarray) -> None:
        """Publish a decode's outputs; embeddings are also pooled per sequence unless pooling is none."""
        self.logits, self.output_ids = rows, out_pos
        if self.embeddings and self.pooling != "none":
            self.embd_seq = pool(self.backend.to_numpy(rows), self.balloc.seq_id, self.balloc.pos, self.pooling)

    def _invalidate_outputs(self) -> None:
        """Outputs belong to one decode: a failed decode leaves none (its ubatches may have
        overwritten rows of the shared buffer), as llama_decode resets them when it starts."""
        self.logits = self.logits[:0]
        self.output_ids = np.empty(0, dtype=np.int64)
        self.embd_seq = {}

    def _logits_buffer(self, n_rows: int) -> np.ndarray:
        """Rows for this decode's logits, reusing one buffer (logits stay valid until the next decode)."""
        if self._logits_store is None or len(self._logits_store) < n_rows:
            self._logits_store = self.backend.xp.empty((n_rows, self.output_width), dtype=np.float32)
        return self._logits_store[:n_rows]

    def _fail(self, status: DecodeStatus, message: str) -> DecodeStatus:
        self.last_error = message
        return status

    def get_logits(self, i: int = -1) -> np.ndarray:
        """Logits of batch index i of the last decode (-1: the last output); valid until the next decode."""
        if self.embeddings:
            raise InvalidInputError("this context computes embeddings, not logits")
        return self._output_row(i, "logits")

    def get_embeddings(self, i: int = -1) -> np.ndarray:
        """The embedding of batch index i of the last decode or encode (-1: the last output)."""
        if not self.embeddings:
            raise InvalidInputError("this context computes logits; embeddings need --embeddings or an encoder")
        return self._output_row(i, "an embedding")

    def get_embeddings_seq(self, seq: int) -> np.ndarray:
        """Sequence seq's pooled embedding from the last decode or encode."""
        if self.pooling == "none" or not self.embeddings:
            raise InvalidInputError("this context does not pool embeddings per sequence")
        if seq not in self.embd_seq:
            raise InvalidInputError(f"the last batch held no tokens of sequence {seq}")
        return self.embd_seq[seq]

    def _output_row(self, i: int, what: str) -> np.ndarray:
        if self.last_error:
            raise InvalidInputError(f"no {what}: the last decode failed ({self.last_error})")
        if i < 0:
            if len(self.logits) == 0:
                raise InvalidInputError(f"the last batch produced no {what}")
            return self.logits[-1]
        row = self.output_ids[i] if i < len(self.output_ids) else -1
        if row < 0:
            raise InvalidInputError(f"batch index {i} did not request {what}")
        return self.logits[row]

    # ---- state files ---------------------------------------------------------------------

    def state_bytes(self, tokens=(), seq: int | None = None) -> bytes:
        """The memory (whole, or one sequence) with the tokens it holds, as bytes.

        A pending K-shift is applied first: state files hold keys at the positions they record
        and carry no shift of their own."""
        self._check_stateful()
        self.memory.update(self.backend)
        w = StateWriter()
        w.parts.append(STATE_MAGIC if seq is None else SEQ_STATE_MAGIC)
        w.u32(STATE_VERSION)
        w.str(self.model.arch)
        w.str(self.model.fingerprint)
        w.str(self.memory.kind)
        w.array(np.asarray(tokens, dtype=np.int32))
        self.memory.state_write(w, seq)
        if self.kind == "enc-dec":
            if self.cross is None:
                CrossInput.write_none(w, self.model.hparams.n_embd)
            else:
                self.cross.state_write(w)
        return w.getvalue()

    def _check_stateful(self) -> None:
        if self.memory is None:
            raise InvalidInputError(f"an encoder context ({self.model.arch}) keeps no state to save or load")

    def load_state_bytes(self, data: bytes, seq: int | None = None, what: str = "state") -> list[int]:
        """Check everything, then replace the memory (or sequence `seq`), and an encoder-decoder's
        encoder output; returns the saved tokens."""
        self._check_stateful()
        r = StateReader(data, what)
        magic = STATE_MAGIC if seq is None else SEQ_STATE_MAGIC
        if bytes(r._take(len(magic), "the magic number")) != magic:
            kind = "a whole-context" if seq is None else "a sequence"
            raise r.fail(f"not {kind} state file of llmsuite")
        version = r.u32("the version")
        if version != STATE_VERSION:
            raise r.fail(f"state version {version} is not supported (this build reads {STATE_VERSION})")
        r.verify_checksum()
        arch, fp = r.str("the architecture"), r.str("the model fingerprint")
        if arch != self.model.arch or fp != self.model.fingerprint:
            raise r.fail(f"it was saved from another model ({excerpt(arch)}, {excerpt(fp[:8])}), not "
                         f"{self.model.name} ({self.model.arch}, {self.model.fingerprint[:8]})")
        r.expect("the memory kind", r.str("the memory kind"), self.memory.kind)
        tokens = r.array("the tokens", np.int32)
        if tokens.ndim != 1 or np.any((tokens < 0) | (tokens >= self.model.hparams.n_vocab)):
            raise r.fail("the token list holds ids outside the vocabulary")
        if seq is not None and not 0 <= seq < self.params.n_seq_max:
            raise InvalidInputError(f"sequence {seq} is out of range (-np {self.params.n_seq_max})")
        loaded = self.memory.state_read(r, seq)
        if self.kind == "enc-dec":
            cross = CrossInput.state_read(r, self.model.hparams.n_embd, self.params.n_seq_max, self.backend.xp)
        r.done()
        described = 0 if seq is None else seq
        if len(tokens) and loaded.pos_max.get(described, -1) != len(tokens) - 1:
            raise r.fail(f"its {len(tokens)} tokens do not match sequence {described}, which ends at "
                         f"position {loaded.pos_max.get(described, -1)}")
        loaded.commit()
        if self.kind == "enc-dec":
            self.cross = cross
        return tokens.tolist()

    def save_state(self, path: str | Path, tokens=()) -> None:
        Path(path).write_bytes(self.state_bytes(tokens))

    def load_state(self, path: str | Path) -> list[int]:
        return self.load_state_bytes(_read(path), what=str(path))

    def save_seq_state(self, path: str | Path, seq: int, tokens=()) -> None:
        Path(path).write_bytes(self.state_bytes(tokens, seq))

    def load_seq_state(self, path: str | Path, seq: int) -> list[int]:
        return self.load_state_bytes(_read(path), seq, what=str(path))


def _read(path: str | Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise StateFileError(f"{path}: no such state file") from None
    except IsADirectoryError:
        raise StateFileError(f"{path}: is a directory, not a state file") from None
