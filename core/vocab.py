"""Tokenizers byte-exact with llama.cpp: SentencePiece-style (SPM) and byte-level BPE.

The flow mirrors `llama_vocab::tokenize`: special tokens are cut out of the text first
(user-defined ones always, control ones only with `parse_special`), then each remaining
fragment goes through the model's tokenizer; BOS/EOS are added per the GGUF keys.
"""

from __future__ import annotations

import codecs
import heapq
from functools import lru_cache

import numpy as np
import regex

from .errors import ModelFileError, UnsupportedError, excerpt
from .gguf import GGUFFile


class Attr:
    """Token attributes (llama_token_attr), as plain int bits: a vocabulary holds one per token,
    and IntFlag arithmetic over 262k tokens cost Gemma 3 a third of a second at load."""
    UNDEFINED = 0
    UNKNOWN = 1 << 0
    UNUSED = 1 << 1
    NORMAL = 1 << 2
    CONTROL = 1 << 3
    USER_DEFINED = 1 << 4
    BYTE = 1 << 5


_BYTE_TYPE = 6
# tokenizer.ggml.token_type value → attribute bits (0 and unknown values: UNDEFINED)
_TYPE_TO_ATTR = np.array([Attr.UNDEFINED, Attr.NORMAL, Attr.UNKNOWN, Attr.CONTROL, Attr.USER_DEFINED, Attr.UNUSED,
                          Attr.BYTE], dtype=np.int64)
_SPECIAL_PARTS = Attr.CONTROL | Attr.USER_DEFINED | Attr.UNKNOWN

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = _LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")

# tokenizer.ggml.pre → (regexes applied in turn, settings that differ from the BPE defaults)
_PRE_TOKENIZERS: dict[str, tuple[list[str], dict]] = {
    "default": ([r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"], {}),
    "gpt-2": ([_GPT2], {}),
    "smollm": ([r"\p{N}", _GPT2], {}),
    "llama3": ([_LLAMA3], {"ignore_merges": True, "add_bos": True}),
    "qwen2": ([_QWEN2], {}),
    "falcon": ([r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]"], {}),
}
_PRE_ALIASES = {
    "phi-2": "gpt-2", "mpt": "gpt-2", "olmo": "gpt-2", "jina-es": "gpt-2", "jina-de": "gpt-2",
    "starcoder": "smollm", "refact": "smollm", "command-r": "smollm", "codeshell": "smollm",
    "exaone": "smollm", "minerva-7b": "smollm",
    "llama-v3": "llama3", "llama-bpe": "llama3", "falcon3": "llama3", "pixtral": "llama3",
    "deepseek-r1-qwen": "qwen2", "megrez": "qwen2",
}

_ESCAPED_SPACE = "\u2581"
_BYTE_TOKEN = regex.compile(r"<0x[0-9A-Fa-f]{2}>")


@lru_cache(maxsize=1)
def gpt2_byte_encoder() -> dict[int, str]:
    """GPT-2's reversible byte → printable character map."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    mapping, extra = {}, 0
    for b in range(256):
        if b in printable:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


@lru_cache(maxsize=1)
def gpt2_byte_decoder() -> dict[str, int]:
    return {c: b for b, c in gpt2_byte_encoder().items()}


def regex_split(text: str, patterns: list[str]) -> list[str]:
    """Apply each pattern in turn; every segment splits into its matches and the gaps between them."""
    segments = [text] if text else []
    for pattern in patterns:
        compiled = _compile(pattern)
        next_segments = []
        for seg in segments:
            start = 0
            for m in compiled.finditer(seg):
                if m.start() > start:
                    next_segments.append(seg[start:m.start()])
                if m.end() > m.start():
                    next_segments.append(m.group())
                start = m.end()
            if start < len(seg):
                next_segments.append(seg[start:])
        segments = next_segments
    return segments


@lru_cache(maxsize=None)
def _compile(pattern: str):
    return regex.compile(pattern)


class Vocab:
    def __init__(self, gguf: GGUFFile):
        self.path = gguf.path
        self.tokenizer_model = gguf.get_str("tokenizer.ggml.model", None)
        if self.tokenizer_model is None:
            raise ModelFileError(f"{gguf.path}: tokenizer.ggml.model is missing (no vocabulary)")
        tokens = gguf.get_strs("tokenizer.ggml.tokens", [])
        if not tokens:
            raise ModelFileError(f"{gguf.path}: tokenizer.ggml.tokens is missing or empty")
        self.tokens: list[str] = tokens
        self.n_tokens = len(tokens)
        scores = gguf.get_numbers("tokenizer.ggml.scores", "iuf", self.n_tokens, None)
        self.scores = scores.astype(float).tolist() if scores is not None else [0.0] * self.n_tokens
        types = gguf.get_numbers("tokenizer.ggml.token_type", "iu", self.n_tokens, None)
        if types is None:
            self.attrs = [Attr.NORMAL] * self.n_tokens
        else:
            known = (types >= 0) & (types < len(_TYPE_TO_ATTR))
            self.attrs = np.where(known, _TYPE_TO_ATTR[np.where(known, types, 0).astype(np.int64)],
                                  Attr.UNDEFINED).tolist()
        if types is not None:
            self._check_byte_tokens(gguf, np.flatnonzero(types == _BYTE_TYPE))
        self.token_to_id: dict[str, int] = {}
        for i, t in enumerate(tokens):
            if t in self.token_to_id:
                raise ModelFileError(f"{gguf.path}: duplicate token {excerpt(t)} has ids {self.token_to_id[t]} and {i}")
            self.token_to_id[t] = i
        self._configure(gguf)
        self._find_special_tokens()
        self.special_tokens = sorted(
            (i for i, a in enumerate(self.attrs) if a & _SPECIAL_PARTS), key=lambda i: -len(self.tokens[i]))
        self._pieces: list[bytes | None] = [None] * self.n_tokens

    def _check_byte_tokens(self, gguf: GGUFFile, ids) -> None:
        for i in ids:
            text = self.tokens[i]
            if not _BYTE_TOKEN.fullmatch(text):
                raise ModelFileError(f"{gguf.path}: token {i} is typed BYTE but its text {excerpt(text)} "
                                     "is not of the form <0xXX>")

    # ---- configuration (llama_vocab::impl::load) -----------------------------------------

    def _configure(self, gguf: GGUFFile) -> None:
        """Defaults per tokenizer type, then whatever the GGUF keys override."""
        self.ignore_merges = False
        self.add_eos = False
        if self.tokenizer_model == "llama":
            self.type = "spm"
            self.bos, self.eos = 1, 2
            self.add_space_prefix, self.add_bos = True, True
        elif self.tokenizer_model == "gpt2":
            self.type = "bpe"
            self.bos, self.eos = 11, 11
            self.add_space_prefix, self.add_bos = False, False
            self._configure_bpe(gguf)
        else:
            raise UnsupportedError(f"{gguf.path}: tokenizer model {excerpt(self.tokenizer_model)} is not supported "
                                   "(llama/SPM and gpt2/BPE are)")
        self.add_space_prefix = gguf.get_bool("tokenizer.ggml.add_space_prefix", self.add_space_prefix)
        for attr, key in (("bos", "bos_token_id"), ("eos", "eos_token_id")):
            if getattr(self, attr) >= self.n_tokens:
                setattr(self, attr, None)
            value = gguf.get_int(f"tokenizer.ggml.{key}", None, hi=(1 << 32) - 1)
            if value is not None and value < self.n_tokens:  # llama.cpp keeps the default for a bad id
                setattr(self, attr, value)
        self.add_bos = gguf.get_bool("tokenizer.ggml.add_bos_token", self.add_bos)
        self.add_eos = gguf.get_bool("tokenizer.ggml.add_eos_token", self.add_eos)
        if self.add_bos and self.bos is None:
            raise ModelFileError(f"{gguf.path}: add_bos_token is true but the BOS token is not set")
        if self.add_eos and self.eos is None:
            raise ModelFileError(f"{gguf.path}: add_eos_token is true but the EOS token is not set")

    def _configure_bpe(self, gguf: GGUFFile) -> None:
        merges = gguf.get_strs("tokenizer.ggml.merges", None)
        if merges is None:
            raise ModelFileError(f"{gguf.path}: BPE vocabulary without tokenizer.ggml.merges")
        self.bpe_ranks: dict[tuple[str, str], int] = {}
        for rank, merge in enumerate(merges):
            pos = merge.find(" ", 1)
            pair = (merge[:pos], merge[pos + 1:]) if pos >= 0 else ("", "")
            self.bpe_ranks.setdefault(pair, rank)
        self.pre = gguf.get_str("tokenizer.ggml.pre", "") or "default"
        name = _PRE_ALIASES.get(self.pre, self.pre)
        if name not in _PRE_TOKENIZERS:
            raise UnsupportedError(f"{gguf.path}: unknown pre-tokenizer type {excerpt(self.pre)}")
        self.pre_regexes, settings = _PRE_TOKENIZERS[name]
        for key, value in settings.items():
            setattr(self, key, value)
        self._bpe_cache: dict[str, list[int]] = {}

    def _find_special_tokens(self) -> None:
        """End-of-generation tokens, found by text as llama.cpp does."""
        eog_texts = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",
                     "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>", "<eos>"}
        fim_eog_texts = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "<|fim_repo|>", "<|repo_name|>",
                         "<fim-repo>", "<REPO>", "<reponame>", "<|file_sep|>"}
        self.eog: set[int] = set()
        for text, i in self.token_to_id.items():
            if text in eog_texts or text in fim_eog_texts:
                self.eog.add(i)
                self.attrs[i] |= Attr.CONTROL
        if self.eos is not None:
            self.eog.add(self.eos)

    # ---- queries --------------------------------------------------------------------------

    def is_eog(self, token: int) -> bool:
        return token in self.eog

    def is_control(self, token: int) -> bool:
        return bool(self.attrs[token] & Attr.CONTROL)

    def byte_to_token(self, byte: int) -> int:
        if self.type == "spm":
            tok = self.token_to_id.get(f"<0x{byte:02X}>", self.token_to_id.get(chr(byte)))
        else:
            tok = self.token_to_id.get(gpt2_byte_encoder()[byte])
        if tok is None:
            raise ModelFileError(f"{self.path}: the vocabulary has no token for the byte 0x{byte:02X}")
        return tok

    # ---- tokenize ------------------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        fragments = self._partition_special(text, parse_special) if text else []
        out: list[int] = []
        if add_special and self.add_bos:
            out.append(self.bos)
        prev_special = True
        for frag in fragments:
            if isinstance(frag, int):
                out.append(frag)
                prev_special = True
            elif self.type == "spm":
                if self.add_space_prefix and prev_special:
                    frag = " " + frag
                self._tokenize_spm(frag.replace(" ", _ESCAPED_SPACE), out)
                prev_special = False
            else:
                self._tokenize_bpe(frag, out)
        if add_special and self.add_eos:
            out.append(self.eos)
        return out

    def _partition_special(self, text: str, parse_special: bool) -> list[str | int]:
        """Split text around special tokens, longest first (tokenizer_st_partition)."""
        fragments: list[str | int] = [text]
        for tok in self.special_tokens:
            if not parse_special and self.attrs[tok] & (Attr.CONTROL | Attr.UNKNOWN):
                continue
            piece = self.tokens[tok]
            if not any(isinstance(f, str) and piece in f for f in fragments):
                continue
            split: list[str | int] = []
            for frag in fragments:
                if isinstance(frag, int) or piece not in frag:
                    split.append(frag)
                    continue
                parts = frag.split(piece)
                for k, part in enumerate(parts):
                    if k:
                        split.append(tok)
                    if part:
                        split.append(part)
            fragments = split
        return fragments

    def _tokenize_spm(self, text: str, out: list[int]) -> None:
        """llm_tokenizer_spm_session: merge the best-scoring adjacent pair while the merge is a token.

        Every merge yields a token, so a final symbol is either a token or a single character
        that is not one; the latter falls back to byte tokens.
        """
        n = len(text)
        symbols = list(text)  # a merged symbol keeps the text in its left slot, "" in the right
        prev = list(range(-1, n - 1))
        nxt = list(range(1, n)) + [-1]
        queue: list[tuple[float, int, int, int]] = []
        to_id, scores = self.token_to_id, self.scores

        def try_add(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            merged = symbols[left] + symbols[right]
            tok = to_id.get(merged)
            if tok is not None:
                heapq.heappush(queue, (-scores[tok], left, right, len(merged)))

        for i in range(1, n):
            try_add(i - 1, i)
        while queue:
            _, left, right, size = heapq.heappop(queue)
            if not symbols[left] or not symbols[right] or len(symbols[left]) + len(symbols[right]) != size:
                continue
            symbols[left] += symbols[right]
            symbols[right] = ""
            nxt[left] = nxt[right]
            if nxt[left] >= 0:
                prev[nxt[left]] = left
            try_add(prev[left], left)
            try_add(left, nxt[left])
        i = 0 if n else -1
        while i != -1:
            tok = to_id.get(symbols[i])
            if tok is not None:
                out.append(tok)
            else:
                out.extend(self.byte_to_token(b) for b in symbols[i].encode("utf-8", errors="surrogateescape"))
            i = nxt[i]

    def _tokenize_bpe(self, text: str, out: list[int]) -> None:
        encoder = gpt2_byte_encoder()
        for word in regex_split(text, self.pre_regexes):
            cached = self._bpe_cache.get(word)
            if cached is None:
                encoded = "".join(encoder[b] for b in word.encode("utf-8", errors="surrogateescape"))
                cached = self._bpe_word(encoded)
                if len(self._bpe_cache) < 100_000:
                    self._bpe_cache[word] = cached
            out.extend(cached)

    def _bpe_word(self, word: str) -> list[int]:
        """Merge the lowest-ranked adjacent pair (leftmost on ties) until no pair is a merge."""
        if self.ignore_merges and word in self.token_to_id:
            return [self.token_to_id[word]]
        symbols = list(word)
        ranks = self.bpe_ranks
        while len(symbols) > 1:
            best, best_rank = -1, None
            for i in range(len(symbols) - 1):
                rank = ranks.get((symbols[i], symbols[i + 1]))
                if rank is not None and (best_rank is None or rank < best_rank):
                    best, best_rank = i, rank
            if best < 0:
                break
            symbols[best:best + 2] = [symbols[best] + symbols[best + 1]]
        ids = []
        for sym in symbols:
            tok = self.token_to_id.get(sym)
            if tok is not None:
                ids.append(tok)
            else:
                ids.extend(t for t in (self.token_to_id.get(c) for c in sym) if t is not None)
        return ids

    # ---- detokenize ----------------------------------------------------------------------

    def token_to_piece(self, token: int, special: bool = False) -> bytes:
        """The bytes a token stands for; control/unknown tokens are empty unless `special`."""
        attr = self.attrs[token]
        if not special and attr & (Attr.CONTROL | Attr.UNKNOWN):
            return b""
        piece = self._pieces[token]
        if piece is None:
            piece = self._piece(token, attr)
            self._pieces[token] = piece
        return piece

    def _piece(self, token: int, attr: Attr) -> bytes:
        text = self.tokens[token]
        if attr & (Attr.CONTROL | Attr.UNKNOWN | Attr.USER_DEFINED):
            return text.encode("utf-8", errors="surrogateescape")
        if attr & Attr.BYTE:
            return bytes([int(text[3:5], 16)])
        if attr & Attr.NORMAL:
            if self.type == "spm":
                return text.replace(_ESCAPED_SPACE, " ").encode("utf-8", errors="surrogateescape")
            decoder = gpt2_byte_decoder()
            return bytes(decoder[c] for c in text if c in decoder)
        return b""

    def detokenize(self, tokens: list[int], special: bool = False) -> str:
        data = b"".join(self.token_to_piece(t, special) for t in tokens)
        return data.decode("utf-8", errors="replace")

    def streamer(self, special: bool = False) -> "TextStreamer":
        return TextStreamer(self, special)


class TextStreamer:
    """Turns tokens into text as they arrive, holding back incomplete UTF-8 sequences."""

    def __init__(self, vocab: Vocab, special: bool = False):
        self.vocab, self.special = vocab, special
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token: int) -> str:
        return self._decoder.decode(self.vocab.token_to_piece(token, self.special))

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)
