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
