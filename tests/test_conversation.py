"""llama-cli's conversation (`llm generate -cnv`, `llm chat`) and interactive mode (`-i`): the
history stays in the cache and only each turn's new tokens are decoded; on a terminal, `> `,
Ctrl-C and Ctrl-D behave as in llama-cli (tested through a pseudo-terminal)."""

import io
import os
import pty
import select
import signal
import sys
import time

import pytest

from conftest import real_model
from llmsuite.core.chat import render_for
from llmsuite.core.context import Context, ContextParams
from llmsuite.core.conversation import Conversation
from llmsuite.core.generation import generate
from llmsuite.core.sampling import Sampler, SamplerParams
from test_cli import assert_one_line_error, llm

QUESTIONS = ["Hi! What is your name?", "What is 2+2?", "Name a color.", "And a fruit?", "Thanks, bye."]
SYSTEM = "You are a helpful assistant."


def greedy() -> Sampler:
    return Sampler(SamplerParams(temp=0))


@pytest.mark.float_reference
def test_five_turns_decode_only_new_tokens_and_answer_as_single_shot():
    model = real_model("smollm2-135m")
    params = ContextParams(n_ctx=2048, type_k="f16", type_v="f16")
    ctx = Context(model, params)
    conv = Conversation(ctx, greedy(), model.chat_template, system=SYSTEM)
    for question in QUESTIONS:
        conv.add_user(question)
        history = render_for(model.vocab, model.chat_template, conv.messages)
        before = ctx.perf.n_p_eval + ctx.perf.n_eval
        fed = conv.feed()
        turn = conv.answer(n_predict=24)
        decoded = ctx.perf.n_p_eval + ctx.perf.n_eval - before
        assert decoded == fed + len(turn.tokens) - (turn.stop == "context")
        single = generate(Context(model, params), greedy(),
                          model.vocab.tokenize(history, add_special=True, parse_special=True), 24)[0]
        assert single.tokens == turn.tokens, question
        assert len(conv.tokens) == ctx.memory.seq_pos_max(0) + 1
    assert len(conv.tokens) > 5 * 24  # the cache holds every turn


def test_a_reverse_prompt_hands_over_after_it_appears():
    model = real_model("smollm2-135m")

    def conversation():
        conv = Conversation(Context(model, ContextParams(n_ctx=512)), greedy(), model.chat_template, system=SYSTEM)
        conv.add_user("What is 2+2?")
        conv.feed()
        return conv
    full = conversation().answer(n_predict=12)
    stop_at = model.vocab.detokenize(full.tokens[:4])
    turn = conversation().answer(n_predict=12, reverse_prompts=("never appears", stop_at))
    assert turn.stop == "reverse prompt" and turn.text == stop_at and turn.tokens == full.tokens[:4]


def test_prefix_suffix_and_exit_in_the_loop(monkeypatch):
    from llmsuite.cli.conversation import converse

    class Recorder:
        ctx = None
        def __init__(self):
            self.inputs = []
        def add_user(self, text):
            self.inputs.append(text)
        def feed(self):
            return 0
        def answer(self, *args):
            from llmsuite.core.conversation import Turn
            return Turn("ok", [1], "eog")

    conv = Recorder()
    monkeypatch.setattr(sys, "stdin", io.StringIO("first\nsecond \\\nline\n/exit\nnever read\n"))
    turns = converse(conv, 8, (), "User: ", "\nBot:")
    assert conv.inputs == ["User: first\nBot:", "User: second \nline\nBot:"] and len(turns) == 2


# ---- through a pseudo-terminal -------------------------------------------------------------

class Terminal:
    """`llm` on a pseudo-terminal: its controlling tty, so Ctrl-C is a SIGINT as in a shell."""

    def __init__(self, *args):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child; a test run in the background inherits SIGINT ignored
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.execv(sys.executable, [sys.executable, "-m", "llmsuite.cli.main", *args])
        self.seen = b""

    def expect(self, text: str, timeout: float = 120.0) -> str:
        deadline = time.monotonic() + timeout
        while text.encode() not in self.seen:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no {text!r} in {self.seen[-400:]!r}"
            if select.select([self.fd], [], [], remaining)[0]:
                try:
                    chunk = os.read(self.fd, 4096)
                except OSError:
                    chunk = b""
                assert chunk, f"the program ended before {text!r}: {self.seen[-400:]!r}"
                self.seen += chunk
        found = self.seen.decode(errors="replace")
        self.seen = self.seen[self.seen.index(text.encode()) + len(text):]
        return found

    def read_some(self, n: int, timeout: float = 120.0) -> None:
        """Wait for n more bytes of output."""
        start, deadline = len(self.seen), time.monotonic() + timeout
        while len(self.seen) - start < n:
            assert time.monotonic() < deadline, f"no output after {self.seen[-400:]!r}"
            if select.select([self.fd], [], [], 0.5)[0]:
                self.seen += os.read(self.fd, 4096)

    def send(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def wait(self, timeout: float = 60.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if select.select([self.fd], [], [], 0.2)[0]:
                    self.seen += os.read(self.fd, 4096)
            except OSError:
                pass
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
        os.kill(self.pid, 9)
        raise AssertionError(f"still running: {self.seen[-400:]!r}")


@pytest.mark.parametrize("command", [["generate", "-cnv"], ["chat"]])
def test_a_terminal_conversation_prompts_answers_and_exits(command):
    term = Terminal(*command, "-n", "16", "--temp", "0", "-c", "1024")
    term.expect("> ")
    term.send("What is 2+2?\r")
    answer = term.expect("> ")
    assert "4" in answer
    term.send("/exit\r")
    assert term.wait() == 0
    assert b"llm_perf_print" in term.seen


def test_ctrl_c_stops_the_answer_and_a_second_one_leaves():
    term = Terminal("generate", "-cnv", "-n", "2000", "--temp", "0", "-c", "4096")
    term.expect("> ")
    term.send("Write a very long story about a dragon and a knight.\r")
    term.expect("knight.\r\n")  # the terminal's echo of the line
    term.read_some(40)  # the answer has started
    term.send("\x03")
    term.expect("> ")
    time.sleep(1.0)  # a person's second Ctrl-C; one in the instant readline starts can wait for a key
    term.send("\x03")
    assert term.wait() == 0


def test_ctrl_d_leaves():
    term = Terminal("generate", "-cnv", "-n", "8", "--temp", "0", "-c", "512")
    term.expect("> ")
    term.send("\x04")
    assert term.wait() == 0


# ---- bad input --------------------------------------------------------------------------------

@pytest.mark.parametrize("args, fragment", [
    (["generate", "-cnv"], "stdin was empty"),
    (["generate", "-cnv", "-r", ""], "cannot be empty"),
    (["generate", "-cnv", "-np", "2"], "drop -np"),
    (["generate", "-cnv", "-i"], "choose one"),
    (["generate", "-p", "hi", "--in-prefix", "User:"], "apply to -cnv and -i"),
    (["generate", "-cnv", "--chat-template", "no-such-template"], "neither a known name"),
])
def test_bad_conversation_flags_are_one_sentence(args, fragment):
    result = llm(*args)
    assert_one_line_error(result, fragment)
    assert result.stdout == ""
