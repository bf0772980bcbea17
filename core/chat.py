"""Render a GGUF's chat template (`tokenizer.chat_template`) with Jinja, as HF templates expect."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from jinja2 import TemplateError

from .errors import InvalidInputError, printable
from .gguf import GGUFFile
from .sandbox import BoundedEnvironment, TemplateRefused


# llama.cpp's fallback when a GGUF has no template, and the names --chat-template takes
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
NAMED_TEMPLATES = {"chatml": CHATML}


@dataclass(frozen=True)
class ChatTemplate:
    """A chat template's Jinja text and where it came from, as errors name it."""
    source: str | None
    origin: str = "the chat template"
    from_model: bool = True


def resolve_template(model_template: str | None, choice: str | None, model_file: str = "the model") -> ChatTemplate:
    """--chat-template NAME or FILE when given, else the GGUF's, else chatml as llama.cpp falls back to."""
    if choice is None:
        if model_template:
            return ChatTemplate(model_template, f"the chat template of {model_file}")
        return ChatTemplate(CHATML, "chatml (the model has none)", from_model=False)
    if choice in NAMED_TEMPLATES:
        return ChatTemplate(NAMED_TEMPLATES[choice], choice, from_model=False)
    path = Path(choice)
    if not path.is_file():
        raise InvalidInputError(f"--chat-template '{choice}' is neither a known name "
                                f"({', '.join(NAMED_TEMPLATES)}) nor a file")
    try:
        return ChatTemplate(path.read_text(encoding="utf-8"), f"the chat template {path}", from_model=False)
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidInputError(f"--chat-template {choice}: cannot read it ({type(e).__name__})") from None


def _raise(message: str):
    raise TemplateError(message)


def render_chat(template: ChatTemplate | str | None, messages: list[dict[str, str]], bos_token: str = "",
                eos_token: str = "", add_generation_prompt: bool = True) -> str:
    """The template over `messages`, bounded in size, time and depth (`sandbox.py`): whatever the
    template does, the result is its text or an InvalidInputError that says what it did."""
    if not isinstance(template, ChatTemplate):
        template = ChatTemplate(template)
    if not template.source:
        raise InvalidInputError("the model has no chat template (tokenizer.chat_template is missing); "
                                "drop --chat and give the raw prompt")
    env = BoundedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals.update(raise_exception=_raise, strftime_now=lambda fmt: datetime.now().strftime(fmt))
    try:
        return env.render(template.source, messages=messages, bos_token=bos_token, eos_token=eos_token,
                          add_generation_prompt=add_generation_prompt)
    except TemplateRefused as e:
        reason = f"was stopped: it {e}"
    except TemplateError as e:
        reason = f"failed to render: {printable(str(e), 300)}"
    except RecursionError:
        reason = "was stopped: it nests deeper than Python's stack allows"
    except MemoryError:
        reason = "was stopped: it ran out of memory"
    except Exception as e:  # noqa: BLE001  (a template is a program from the model file: any failure is its own)
        reason = f"failed to render ({type(e).__name__}: {printable(str(e), 300)})"
    raise InvalidInputError(f"{template.origin} {reason}")


def read_chat_template(path: Path) -> str | None:
    """The chat template in a GGUF's metadata, read without loading the model."""
    gguf = GGUFFile(path)
    try:
        return gguf.get_str("tokenizer.chat_template", None)
    finally:
        gguf.close()


def read_vocab_size(path: Path) -> int:
    """How many tokens a GGUF's vocabulary holds, read without loading the model."""
    gguf = GGUFFile(path)
    try:
        return len(gguf.get_strs("tokenizer.ggml.tokens"))
    finally:
        gguf.close()


def probe_template(template: ChatTemplate, system: str | None, user: str) -> None:
    """Render a conversation like the one to come (without BOS/EOS, which need the vocabulary):
    a template that fails or passes a bound is refused in a moment, not after the weights load."""
    render_chat(template, _messages(user, system))


def _messages(user: str, system: str | None) -> list[dict[str, str]]:
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]


def render_for(vocab, template: ChatTemplate | str, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
    """`template` over `messages` with the vocabulary's BOS/EOS, ready to tokenize (without a
    leading BOS the tokenizer adds itself)."""
    bos = vocab.tokens[vocab.bos] if vocab.bos is not None else ""
    eos = vocab.tokens[vocab.eos] if vocab.eos is not None else ""
    text = render_chat(template, messages, bos_token=bos, eos_token=eos, add_generation_prompt=add_generation_prompt)
    if vocab.add_bos and bos and text.startswith(bos):
        text = text[len(bos):]
    return text


def chat_prompt(model, user: str, system: str | None = None, template: ChatTemplate | None = None) -> str:
    """A template (the model's unless given) applied to one user turn and a system message."""
    messages = _messages(user, system)
    template = template or ChatTemplate(model.chat_template, f"the chat template of {model.path.name}")
    return render_for(model.vocab, template, messages)
