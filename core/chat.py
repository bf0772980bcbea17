"""Render a GGUF's chat template (`tokenizer.chat_template`) with Jinja, as HF templates expect."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import InvalidInputError


# llama.cpp's fallback when a GGUF has no template, and the names --chat-template takes
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
NAMED_TEMPLATES = {"chatml": CHATML}


def resolve_template(model_template: str | None, choice: str | None) -> tuple[str, str]:
    """(template, where it came from): --chat-template NAME or FILE when given, else the GGUF's,
    else chatml as llama.cpp falls back to."""
    if choice is None:
        return (model_template, "the model's") if model_template else (CHATML, "chatml (the model has none)")
    if choice in NAMED_TEMPLATES:
        return NAMED_TEMPLATES[choice], choice
    path = Path(choice)
    if not path.is_file():
        raise InvalidInputError(f"--chat-template '{choice}' is neither a known name "
                                f"({', '.join(NAMED_TEMPLATES)}) nor a file")
    try:
        return path.read_text(encoding="utf-8"), str(path)
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidInputError(f"--chat-template {choice}: cannot read it ({type(e).__name__})") from None


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


def render_for(vocab, template: str, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
    """`template` over `messages` with the vocabulary's BOS/EOS, ready to tokenize (without a
    leading BOS the tokenizer adds itself)."""
    bos = vocab.tokens[vocab.bos] if vocab.bos is not None else ""
    eos = vocab.tokens[vocab.eos] if vocab.eos is not None else ""
    text = render_chat(template, messages, bos_token=bos, eos_token=eos, add_generation_prompt=add_generation_prompt)
    if vocab.add_bos and bos and text.startswith(bos):
        text = text[len(bos):]
    return text


def chat_prompt(model, user: str, system: str | None = None, template: str | None = None) -> str:
    """A template (the model's unless given) applied to one user turn and a system message."""
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    return render_for(model.vocab, template or model.chat_template, messages)
