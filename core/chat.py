"""Render a GGUF's chat template (`tokenizer.chat_template`) with Jinja, as HF templates expect."""

from __future__ import annotations

from datetime import datetime

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import InvalidInputError


def _raise(message: str):
    raise TemplateError(message)


def render_chat(template: str | None, messages: list[dict[str, str]], bos_token: str = "", eos_token: str = "",
                add_generation_prompt: bool = True) -> str:
    if not template:
        raise InvalidInputError("the model has no chat template (tokenizer.chat_template is missing); "
                                "drop --chat and give the raw prompt")
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals.update(raise_exception=_raise, strftime_now=lambda fmt: datetime.now().strftime(fmt))
    try:
        text = env.from_string(template).render(messages=messages, bos_token=bos_token, eos_token=eos_token,
                                                add_generation_prompt=add_generation_prompt)
    except TemplateError as e:
        raise InvalidInputError(f"the chat template failed to render: {e}") from None
    return text


def chat_prompt(model, user: str, system: str | None = None) -> str:
    """The model's template applied to one user turn (and a system message), ready to tokenize."""
    vocab = model.vocab
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    bos = vocab.tokens[vocab.bos] if vocab.bos is not None else ""
    eos = vocab.tokens[vocab.eos] if vocab.eos is not None else ""
    text = render_chat(model.chat_template, messages, bos_token=bos, eos_token=eos)
    if vocab.add_bos and bos and text.startswith(bos):
        text = text[len(bos):]  # the tokenizer adds it
    return text
