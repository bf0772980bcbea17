"""Errors that carry one clear sentence for the user.

The CLI prints `str(error)` and exits non-zero; anything else is a bug and gets a traceback.
"""


class LLMError(Exception):
    """Base class: an error caused by input, files or the environment, not by a bug."""


class ModelFileError(LLMError):
    """A GGUF file that is missing, corrupt, truncated or not a GGUF at all."""


class UnsupportedError(LLMError):
    """A valid file that asks for something this engine does not implement."""


class InvalidInputError(LLMError):
    """Bad flags, a prompt that does not fit, an invalid batch."""


class HubError(LLMError):
    """A model could not be fetched or verified."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a long run (perplexity, KL-divergence, embeddings), carrying what the run had
    finished before it as `partial`, of the type the run returns."""

    def __init__(self, partial):
        super().__init__("interrupted")
        self.partial = partial


def excerpt(value, limit: int = 40) -> str:
    """A short printable quotation of a value read from a file, for error messages: control
    characters and undecodable bytes escaped, anything long cut to about `limit` characters."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="surrogateescape")
    if isinstance(value, str):
        return f"'{printable(value, limit)}'"
    if isinstance(value, (list, tuple)) or hasattr(value, "tolist"):
        items = value.tolist() if hasattr(value, "tolist") else value
        if not isinstance(items, list):
            return excerpt(items, limit)
        shown = ", ".join(excerpt(v, limit // 4) for v in items[:3])
        return f"[{shown}{', …' if len(items) > 3 else ''}] ({len(items)} values)"
    text = repr(value)
    return text if len(text) <= limit else text[: limit // 2] + "…" + text[-4:]


def _escape(ch: str) -> str:
    code = ord(ch)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8 (surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    return ch.encode("unicode_escape").decode("ascii")


def printable(text: str, limit: int = 2000) -> str:
    """Text from a file or an error, safe for a terminal: one line, escaped, at most `limit` characters."""
    shown = "".join(ch if ch.isprintable() else _escape(ch) for ch in text[:limit])
    return shown + ("…" if len(text) > limit else "")
