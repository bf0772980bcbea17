"""`llm generate -cnv` / `llm chat` (llama-cli's conversation) and `llm generate -i` (interactive):
read a turn, answer it over the same context, repeat until `/exit`, end of input or a second Ctrl-C.

On a terminal the prompt is `> `; piped input is read a line per turn. Ctrl-C while the model
answers stops the answer and returns to the prompt; Ctrl-C at the prompt (or twice in an answer)
leaves.
"""

from __future__ import annotations

import signal
import sys
from contextlib import contextmanager

from llmsuite.core.conversation import Conversation, Turn
from llmsuite.core.errors import InvalidInputError

EXIT_COMMANDS = ("/exit", "/quit")
PROMPT_COLOR, INPUT_COLOR, RESET = "\x1b[33m", "\x1b[32m", "\x1b[0m"  # llama.cpp's --color: yellow, green


def colored(text: str, code: str, on: bool) -> str:
    return f"{code}{text}{RESET}" if on and text else text


class Interrupts:
    """SIGINT while an answer streams: the first sets a flag the loop checks per token, the second
    raises KeyboardInterrupt as usual."""

    def __init__(self):
        self.flag = False

    def __call__(self) -> bool:
        return self.flag

    @contextmanager
    def during_answer(self):
        self.flag = False

        def handler(signum, frame):
            if self.flag:
                raise KeyboardInterrupt
            self.flag = True
        previous = signal.signal(signal.SIGINT, handler)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)


def read_turn(interactive_terminal: bool, color: bool = False, multiline: bool = False) -> str | None:
    """One turn of input; None at the end of input, /exit or Ctrl-C. As llama-cli reads it: a line
    ending in a backslash continues on the next line, or with `multiline` (-mli) every line does
    and a backslash ends the input; a line ending in / always ends it."""
    lines = []
    while True:
        try:
            if interactive_terminal:
                line = input(("> " if not lines else "") + (INPUT_COLOR if color else ""))
                if color:
                    sys.stdout.write(RESET)
            else:
                line = sys.stdin.readline()
                if not line:
                    return None if not lines else "\n".join(lines)
                line = line.rstrip("\n")
        except (EOFError, KeyboardInterrupt):
            if interactive_terminal:
                sys.stdout.write("\n")
            return None
        more = multiline
        if line.endswith("/"):
            line, more = line[:-1], False
        elif line.endswith("\\"):
            line, more = line[:-1], not multiline
        lines.append(line)
        if more:
            continue
        text = "\n".join(lines)
        return None if text.strip() in EXIT_COMMANDS else text


def converse(conv: Conversation, n_predict: int, reverse_prompts: tuple[str, ...], in_prefix: str, in_suffix: str,
             answer_first: bool = False, color: bool = False, single_turn: bool = False,
             multiline: bool = False) -> list[Turn]:
    """The loop; returns the answers. `answer_first`: interactive mode continues the prompt before
    it asks for input; `single_turn` (-st) ends after the first answer to an input; `multiline`
    as read_turn's."""
    terminal = sys.stdin.isatty()
    interrupts = Interrupts()
    turns: list[Turn] = []

    def show(piece: str) -> None:
        sys.stdout.write(piece)
        sys.stdout.flush()

    def answer() -> None:
        with interrupts.during_answer():  # a Ctrl-C while the turn is read in stops its answer
            conv.feed()
            turn = conv.answer(n_predict, reverse_prompts, show, interrupts)
        turns.append(turn)
        if turn.stop == "context":
            raise InvalidInputError(f"the context is full (-c {conv.ctx.n_ctx}); start again with a larger -c")
        show("\n")

    if answer_first:
        answer()
    while not (single_turn and len(turns) > int(answer_first)):
        text = read_turn(terminal, color, multiline)
        if text is None:
            if not turns and not terminal:
                raise InvalidInputError("no input: -cnv and -i read each turn from a terminal or from stdin, "
                                        "and stdin was empty")
            return turns
        conv.add_user(in_prefix + text + in_suffix)
        answer()
    return turns
