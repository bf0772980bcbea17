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
