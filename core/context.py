"""`Context`: a model plus its memory; `decode` runs batches the way llama_decode does, `encode`
runs an encoder the way llama_encode does, and the state (memory plus the tokens it holds, and an
encoder-decoder's encoder output) can be saved and loaded whole or per sequence.

Context kinds (`--ctx`) are classes: `DecoderContext` (a causal decoder over a memory),
`NoKVContext` (a decoder without a cache), `EncoderContext` (no memory; embeddings, pooled per
sequence) and `EncoderDecoderContext` (the encoder's output is kept for the decoder's
cross-attention). `Context(model, params)` builds the kind the resolved plan (core/plan.py) names;
the tools call the interface here (`decode`, `clear`, `check_prompt`, `start_prompt`,
`seq_capacity`, the state files) without asking which kind they hold."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from enum import IntEnum
from pathlib import Path
from typing import ClassVar

import numpy as np

from .atomic import write_atomic
from .backend import default_cache_type
from .batch import Batch, BatchAllocator
from .cross import CrossInput
from .embeddings import pool
from .errors import InvalidInputError, LLMError, excerpt
from .graph import AttnStats, Graph
from .memory import MemoryParams, MemoryStatus, create_memory
from .memory.batch_only import BatchOnlyContext
from .memory.factory import mask_name
from .models.base import Model
from .plan import check_flags, resolve_plan
from .plugins import describe, from_plugin
from .statefile import StateFileError, StateReader, StateWriter
from .threads import use_threads

STATE_MAGIC, SEQ_STATE_MAGIC = b"LLMSTATE", b"LLMSEQST"
# A state file: magic, version, architecture, model fingerprint, memory kind, the tokens (for
# --prompt-cache: sequence 0's, or the saved sequence's, at positions 0..n-1), the memory's own
# fields, and a CRC-32 of all that. Keys are stored rotated to the positions recorded: a pending
# K-shift is applied before writing, so no shift is saved.
STATE_VERSION = 4


class DecodeStatus(IntEnum):
    """llama_decode's return codes."""
    OK = 0
    NO_SLOT = 1
    ABORTED = 2
    INVALID_BATCH = -1
    COMPUTE_FAILED = -3


def check_status(ctx: "Context", status: DecodeStatus) -> None:
    """A failed decode as an exception: Ctrl-C (the decode rolled back) stays an interruption."""
    if status == DecodeStatus.ABORTED:
        raise KeyboardInterrupt
    if status != DecodeStatus.OK:
        raise LLMError(f"decode failed ({status.name.lower().replace('_', ' ')}): {ctx.last_error}") \
            from ctx.last_exception

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
        check_flags(self)


def context_params(model: Model, params: ContextParams | None, flags: dict) -> ContextParams:
    """`params` (or the defaults, on the model's backend) with `flags` in ContextParams' names
    (n_ctx=4096, kv="unified", ...): Context(model, kv="split", n_seq_max=4) as the CLI's flags."""
    unknown = set(flags) - set(ContextParams.__dataclass_fields__)
    if unknown:
        raise TypeError(f"Context() got unknown parameters: {', '.join(sorted(unknown))} "
                        f"(known: {', '.join(ContextParams.__dataclass_fields__)})")
    if params is None:
        backend = flags.get("backend", model.backend.name)
        params = ContextParams(backend=backend, type_k=default_cache_type(backend), type_v=default_cache_type(backend))
    return replace(params, **flags)


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
    """A model plus what it keeps between batches. `Context(model, params)` resolves the plan once and
    builds the kind it names (one of the subclasses below); the base holds what every kind shares."""

    kind: ClassVar[str] = ""  # what -v prints: "decoder", "no-kv", "encoder", "enc-dec"
    generates: ClassVar[bool] = True  # a decoder: it generates tokens (an encoder only embeds)
    needs_encoded_input: ClassVar[bool] = False  # its decoder attends an encoder output (encode first)
    has_encoder: ClassVar[bool] = False  # `encode` runs the model's encoder

    def __new__(cls, model: Model, params: ContextParams | None = None, observer=None, **flags):
        params = context_params(model, params, flags)
        params.validate()
        if params.n_ctx == 0:
            params.n_ctx = model.hparams.n_ctx_train
        params.n_batch = min(params.n_batch, params.n_ctx)
        params.n_ubatch = min(params.n_ubatch, params.n_batch)
        if params.backend != model.backend.name:
            raise InvalidInputError(f"the model was loaded for the {model.backend.name} backend, not {params.backend}")
        plan = resolve_plan(model, params)
        kind = CONTEXT_KINDS[plan.context]
        if not issubclass(kind, cls):
            raise InvalidInputError(f"{model.arch} with these flags makes a {plan.context} context, not an "
                                    f"{cls.__name__}")
        self = super().__new__(kind)
        self.params, self.plan = params, plan
        return self

    def __init__(self, model: Model, params: ContextParams | None = None, observer=None, **flags):
        params, hp = self.params, model.hparams  # params and flags made one by __new__, with the plan
        self.model = model
        self.backend = model.backend.configured(attn_path=self.plan.attn_path, numerics=self.plan.numerics)
        self.memory = self._create_memory()
        self.embeddings = params.embeddings or not self.generates  # an encoder's outputs are embeddings
        self.pooling = params.pooling if params.pooling != "auto" else (hp.pooling or "none")
        self.balloc = BatchAllocator(hp.n_vocab, params.n_seq_max)
        self._logits_store: np.ndarray | None = None
        self.logits = np.empty((0, self.output_width), dtype=np.float32)  # or embeddings, per output row
        self.output_ids = np.empty(0, dtype=np.int64)  # batch index → logits row (-1: no output)
        self.embd_seq: dict[int, np.ndarray] = {}  # pooled embeddings of the last batch's sequences
        self.perf = PerfCounters()
        self.last_error = ""
        self.last_exception: BaseException | None = None  # what a plugin raised in the last failed decode
        self.observer = observer  # observer(name, ubatch, tensor) sees named intermediates
        self.attn_stats: AttnStats | None = None  # set one to count and time attention per layer (-v)

    def _create_memory(self):
        return create_memory(self.plan, self.params, self.backend)

    @property
    def n_ctx(self) -> int:
        return self.params.n_ctx

    @property
    def output_width(self) -> int:
        hp = self.model.hparams
        return hp.n_embd if self.embeddings else hp.n_vocab

    # ---- what the tools ask of any kind --------------------------------------------------------

    def clear(self) -> None:
        """Forget every sequence."""
        self.memory.clear()

    def seq_capacity(self) -> int:
        """Cells one sequence can use: the context's, or fewer where the memory bounds a sequence
        (--kv split gives each its own stream)."""
        own = self.memory.seq_capacity()
        return self.n_ctx if own is None else min(own, self.n_ctx)

    def check_prompt(self, tokens: list[int], margin: int = 0) -> None:
        """Refuse a prompt this context cannot take, keeping `margin` cells free for generation."""
        if not tokens:
            raise InvalidInputError("the prompt is empty and the model adds no BOS token")
        limit = self.seq_capacity() - margin
        if len(tokens) > limit:
            raise InvalidInputError(f"the prompt is too long ({len(tokens)} tokens, the context -c {self.n_ctx} "
                                    f"allows {max(limit, 0)} per sequence)")

    def start_prompt(self, prompt: list[int], n_seqs: int, prompt_cache: Path | None = None) -> list[int]:
        """The tokens the decoder decodes for `prompt` completed by `n_seqs` sequences: the prompt
        itself (an encoder-decoder encodes it and decodes from its start token)."""
        return prompt

    def prompt(self, batch: Batch) -> DecodeStatus:
        """Run a prompt batch where this kind takes prompts: the decoder (the encoder for kinds that have one)."""
        return self.decode(batch)

    @property
    def prompt_batch(self) -> int:
        """The most tokens `prompt` takes in one call."""
        return self.params.n_batch

    # ---- decoding ------------------------------------------------------------------------

    def decode(self, batch: Batch) -> DecodeStatus:
        """Run a batch; on failure the memory is as before the failed ubatch (the ubatches done
        before it stay, as in llama.cpp): the memory context rolls that ubatch back."""
        t0 = time.perf_counter()
        self.last_error, self.last_exception = "", None
        self._invalidate_outputs()
        if len(batch) > self.params.n_batch:
            return self._fail(DecodeStatus.INVALID_BATCH,
                              f"the batch has {len(batch)} tokens, more than -b {self.params.n_batch}")
        refusal = self._decode_refusal()
        if refusal:
            return self._fail(DecodeStatus.INVALID_BATCH, refusal)
        try:
            self.balloc.init(batch, self.memory, output_all=self.embeddings)
        except InvalidInputError as e:
            return self._fail(DecodeStatus.INVALID_BATCH, str(e))
        if self.backend.name == "cpu":  # llama.cpp: -t for a one-token step, -tb for batches
            p = self.params
            use_threads(p.n_threads if len(batch) == 1 else (p.n_threads_batch or p.n_threads))
        try:
            self.memory.update(self.backend)
            mctx = self.memory.init_batch(self.balloc, self.params.n_ubatch)  # plans only: nothing to undo
        except Exception as e:
            return self._plugin_failed(e)
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
                out = self.model.forward(self._graph(mctx, target))
                if not contiguous:
                    logits[self.backend.asarray(rows)] = out
            except KeyboardInterrupt:
                mctx.rollback()
                return self._fail(DecodeStatus.ABORTED, "interrupted")
            except (MemoryError, FloatingPointError) as e:
                mctx.rollback()
                return self._fail(DecodeStatus.COMPUTE_FAILED, f"compute failed: {e}")
            except Exception as e:
                mctx.rollback()  # keep memory consistent, then surface the error
                return self._plugin_failed(e)
            if not mctx.next():
                break
        self._set_outputs(logits, out_pos)
        one_per_sequence = len(np.unique(self.balloc.seq_id)) == len(batch)
        self.perf.add(len(batch), time.perf_counter() - t0, step=one_per_sequence)
        return DecodeStatus.OK

    def _plugin_failed(self, e: Exception) -> DecodeStatus:
        """A plugin's memory kind, mask producer or architecture broke the protocol: the decode
        fails naming it (the memory already rolled back). Without a plugin in play it is a bug:
        raised as it is."""
        plugin = self._plugin_in_use()
        if not plugin:
            raise e
        self.last_exception = e
        return self._fail(DecodeStatus.COMPUTE_FAILED, f"{plugin} failed: {type(e).__name__}: {e}")

    def _plugin_in_use(self) -> str:
        """The plugin this context runs ("" when none): its memory kind, mask producer or architecture."""
        used = (("memory kind", self.plan.memory), ("mask producer", mask_name(self.params)),
                ("architecture", self.model.arch))
        return next((describe(registry, name) for registry, name in used if from_plugin(registry, name)), "")

    def _decode_refusal(self) -> str:
        """Why this kind cannot decode now ("": it can)."""
        return ""

    def _graph(self, mctx, target, embeddings: bool | None = None) -> Graph:
        return Graph(self.model, mctx, self.backend, self.observer, target, stats=self.attn_stats,
                     embeddings=self.embeddings if embeddings is None else embeddings, cross=self._cross_input(),
                     attn_impl=self.plan.attn_impl)

    def _cross_input(self) -> CrossInput | None:
        return None

    def encode(self, batch: Batch) -> DecodeStatus:
        """Run the encoder over a batch in one micro-batch, each sequence attending all of its own
        tokens (kinds with an encoder; `_keep_encoded` says what becomes of the output)."""
        t0 = time.perf_counter()
        self.last_error = ""
        self._invalidate_outputs()
        if not self.has_encoder:
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
        target = self._encoder_target(len(batch))
        try:
            out = self.model.encode(Graph(self.model, mctx, self.backend, self.observer, target, embeddings=True))
        except KeyboardInterrupt:
            return self._fail(DecodeStatus.ABORTED, "interrupted")
        except InvalidInputError as e:
            return self._fail(DecodeStatus.INVALID_BATCH, str(e))
        except (MemoryError, FloatingPointError) as e:
            return self._fail(DecodeStatus.COMPUTE_FAILED, f"compute failed: {e}")
        self._keep_encoded(out, ub)
        self.perf.add(len(batch), time.perf_counter() - t0)
        return DecodeStatus.OK

    def _encoder_target(self, n_tokens: int):
        """Where the encoder writes its output (None: a new array)."""
        return None

    def _keep_encoded(self, out, ub) -> None:
        """What an encode leaves: the embeddings (an encoder), the decoder's cross input (enc-dec)."""

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
        self.memory.update(self.backend)
        w = StateWriter()
        w.parts.append(STATE_MAGIC if seq is None else SEQ_STATE_MAGIC)
        w.u32(STATE_VERSION)
        w.str(self.model.arch)
        w.str(self.model.fingerprint)
        w.str(self.memory.kind)
        w.array(np.asarray(tokens, dtype=np.int32))
        self.memory.state_write(w, seq)
        self._state_write_extra(w)
        return w.getvalue()

    def _state_write_extra(self, w: StateWriter) -> None:
        """What this kind keeps beside the memory (an encoder-decoder: the encoder output)."""

    def _state_read_extra(self, r: StateReader):
        """Read what _state_write_extra wrote; returns a function that commits it."""
        return lambda: None

    def load_state_bytes(self, data: bytes, seq: int | None = None, what: str = "state") -> list[int]:
        """Check everything, then replace the memory (or sequence `seq`), and an encoder-decoder's
        encoder output; returns the saved tokens."""
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
        commit_extra = self._state_read_extra(r)
        r.done()
        described = 0 if seq is None else seq
        if len(tokens) and loaded.pos_max.get(described, -1) != len(tokens) - 1:
            raise r.fail(f"its {len(tokens)} tokens do not match sequence {described}, which ends at "
                         f"position {loaded.pos_max.get(described, -1)}")
        loaded.commit()
        commit_extra()
        return tokens.tolist()

    def save_state(self, path: str | Path, tokens=()) -> None:
        write_atomic(path, self.state_bytes(tokens))

    def load_state(self, path: str | Path) -> list[int]:
        return self.load_state_bytes(_read(path), what=str(path))

    def save_seq_state(self, path: str | Path, seq: int, tokens=()) -> None:
        write_atomic(path, self.state_bytes(tokens, seq))

    def load_seq_state(self, path: str | Path, seq: int) -> list[int]:
        return self.load_state_bytes(_read(path), seq, what=str(path))


class DecoderContext(Context):
    """A causal decoder over the memory the plan names (llama_decode)."""
    kind = "decoder"


class NoKVContext(DecoderContext):
    """A decoder without a cache: every batch recomputes the prefix it attends (--kv none)."""
    kind = "no-kv"


class EncoderContext(Context):
    """An encoder (BERT): no memory; a batch is encoded whole and its outputs are embeddings, pooled
    per sequence. llama_decode on it forwards to llama_encode, as here."""
    kind = "encoder"
    generates = False
    has_encoder = True

    def _create_memory(self):
        return None

    def clear(self) -> None:
        """Nothing is kept between batches."""

    def seq_capacity(self) -> int:
        return self.n_ctx

    def check_prompt(self, tokens: list[int], margin: int = 0) -> None:
        raise InvalidInputError(f"{self.model.arch} is an encoder: it generates no text (llm embed gives its vectors)")

    @property
    def prompt_batch(self) -> int:
        return self.params.n_ubatch

    def decode(self, batch: Batch) -> DecodeStatus:
        return self.encode(batch)

    def _encoder_target(self, n_tokens: int):
        return self._logits_buffer(n_tokens)

    def _keep_encoded(self, out, ub) -> None:
        self._set_outputs(out, np.arange(ub.n_tokens))

    def state_bytes(self, tokens=(), seq: int | None = None) -> bytes:
        raise self._stateless()

    def load_state_bytes(self, data: bytes, seq: int | None = None, what: str = "state") -> list[int]:
        raise self._stateless()

    def _stateless(self) -> InvalidInputError:
        return InvalidInputError(f"an encoder context ({self.model.arch}) keeps no state to save or load")


class EncoderDecoderContext(DecoderContext):
    """An encoder-decoder (T5): `encode` keeps the encoder's output, which the decoder's
    cross-attention reads in every later decode (and which state files carry)."""
    kind = "enc-dec"
    needs_encoded_input = True
    has_encoder = True

    def __init__(self, model: Model, params: ContextParams | None = None, observer=None, **flags):
        super().__init__(model, params, observer)
        self.cross: CrossInput | None = None  # the last encode's output

    def check_prompt(self, tokens: list[int], margin: int = 0) -> None:
        if len(tokens) > self.params.n_ubatch:
            raise InvalidInputError(f"the prompt is too long for the encoder ({len(tokens)} tokens; it encodes one "
                                    f"micro-batch, -ub {self.params.n_ubatch})")
        super().check_prompt(tokens, margin)

    def start_prompt(self, prompt: list[int], n_seqs: int, prompt_cache: Path | None = None) -> list[int]:
        """The prompt goes to the encoder, once per sequence that will decode; the decoder then starts
        from the decoder start token over an empty memory (llama-completion)."""
        if prompt_cache:
            raise InvalidInputError(f"--prompt-cache keeps a decoder prompt; {self.model.arch} encodes every prompt anew")
        tokens = np.tile(np.asarray(prompt, np.int32), n_seqs)
        batch = Batch(tokens, np.tile(np.arange(len(prompt), dtype=np.int32), n_seqs),
                      np.repeat(np.arange(n_seqs, dtype=np.int32), len(prompt)))
        status = self.encode(batch)
        if status != DecodeStatus.OK:
            raise LLMError(f"encode failed ({status.name.lower().replace('_', ' ')}): {self.last_error}")
        self.memory.clear()
        return [self.model.decoder_start_id]

    def prompt(self, batch: Batch) -> DecodeStatus:
        return self.encode(batch)

    @property
    def prompt_batch(self) -> int:
        return self.params.n_ubatch

    def _decode_refusal(self) -> str:
        if self.cross is None:
            return f"{self.model.arch}'s decoder needs an encoded input: encode before decoding"
        return ""

    def _cross_input(self) -> CrossInput | None:
        return self.cross

    def _keep_encoded(self, out, ub) -> None:
        self.cross = CrossInput(out, ub.seq_id, self.backend.xp)  # replaces the last encode's

    def _state_write_extra(self, w: StateWriter) -> None:
        if self.cross is None:
            CrossInput.write_none(w, self.model.hparams.n_embd)
        else:
            self.cross.state_write(w)

    def _state_read_extra(self, r: StateReader):
        cross = CrossInput.state_read(r, self.model.hparams.n_embd, self.params.n_seq_max, self.backend.xp)

        def commit() -> None:
            self.cross = cross
        return commit


CONTEXT_KINDS: dict[str, type[Context]] = {cls.kind: cls for cls in
                                           (DecoderContext, NoKVContext, EncoderContext, EncoderDecoderContext)}


def _read(path: str | Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise StateFileError(f"{path}: no such state file") from None
    except IsADirectoryError:
        raise StateFileError(f"{path}: is a directory, not a state file") from None
