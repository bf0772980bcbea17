"""`llm generate`: complete a prompt like llama-completion, streaming tokens to stdout."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from llmsuite.core.chat import chat_prompt
from llmsuite.core.context import Context, ContextParams
from llmsuite.core.errors import InvalidInputError
from llmsuite.core.generation import check_prompt, generate as run_generation
from llmsuite.core.sampling import DEFAULT_SEED, Sampler, SamplerParams

from .common import err_console, open_model, read_text_file


def generate(
    model: Annotated[Optional[str], typer.Option("-m", "--model", help="GGUF path or known model name")] = None,
    prompt: Annotated[Optional[str], typer.Option("-p", "--prompt", help="prompt text")] = None,
    file: Annotated[Optional[Path], typer.Option("-f", "--file", help="read the prompt from a file")] = None,
    n_predict: Annotated[int, typer.Option("-n", "--n-predict", help="tokens to generate (-1: until end)")] = -1,
    ctx_size: Annotated[int, typer.Option("-c", "--ctx-size", help="context size (0: the model's)")] = 0,
    batch_size: Annotated[int, typer.Option("-b", "--batch-size", help="logical batch size")] = 2048,
    ubatch_size: Annotated[int, typer.Option("-ub", "--ubatch-size", help="physical micro-batch size")] = 512,
    seed: Annotated[int, typer.Option("-s", "--seed", help="sampling seed (default: random)")] = DEFAULT_SEED,
    temp: Annotated[float, typer.Option("--temp", help="temperature (0: greedy)")] = 0.8,
    top_k: Annotated[int, typer.Option("--top-k")] = 40,
    top_p: Annotated[float, typer.Option("--top-p")] = 0.95,
    min_p: Annotated[float, typer.Option("--min-p")] = 0.05,
    repeat_penalty: Annotated[float, typer.Option("--repeat-penalty")] = 1.0,
    repeat_last_n: Annotated[int, typer.Option("--repeat-last-n")] = 64,
    chat: Annotated[bool, typer.Option("--chat", help="format the prompt with the model's chat template")] = False,
    system: Annotated[Optional[str], typer.Option("--system", "-sys", help="system message for --chat")] = None,
    display_prompt: Annotated[bool, typer.Option("--display-prompt/--no-display-prompt")] = True,
) -> None:
    """Generate text from a prompt (llama-completion)."""
    text = _prompt_text(prompt, file)
    _check_sampling(temp, repeat_penalty, n_predict)
    if system is not None and not chat:
        raise InvalidInputError("--system only applies with --chat")
    params = ContextParams(n_ctx=ctx_size, n_batch=batch_size, n_ubatch=ubatch_size)
    params.validate()
    lm, t_load = open_model(model)
    vocab = lm.vocab
    ctx = Context(lm, params)
    if chat:
        text = chat_prompt(lm, text, system)
    tokens = vocab.tokenize(text, add_special=True, parse_special=True)
    check_prompt(ctx, tokens)
    sampler = Sampler(SamplerParams(seed=seed, temp=temp, top_k=top_k, top_p=top_p, min_p=min_p,
                                    repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n))
    err_console.print(f"sampler seed: {sampler.seed}\nsampler chain: {sampler.describe()}")
    if display_prompt:
        sys.stdout.write(text)
        sys.stdout.flush()
    streamer = vocab.streamer()

    def emit(token: int) -> None:
        sys.stdout.write(streamer.push(token))
        sys.stdout.flush()

    result = run_generation(ctx, sampler, tokens, n_predict, on_token=emit)
    sys.stdout.write(streamer.flush())
    if result.stop == "eog":
        sys.stdout.write(" [end of text]\n")
    elif result.stop == "context":
        err_console.print("\ncontext full and context shift is disabled => stopping")
    sys.stdout.write("\n")
    sys.stdout.flush()
    print_perf(ctx, t_load, result.t_sample, len(result.tokens))


def _prompt_text(prompt: str | None, file: Path | None) -> str:
    if prompt is not None and file is not None:
        raise InvalidInputError("give the prompt with -p or -f, not both")
    if file is not None:
        return read_text_file(file)
    return prompt or ""


def _check_sampling(temp: float, repeat_penalty: float, n_predict: int) -> None:
    if temp < 0:
        raise InvalidInputError("--temp must be >= 0")
    if not repeat_penalty > 0:
        raise InvalidInputError("--repeat-penalty must be a positive number")
    if n_predict < -1:
        raise InvalidInputError("-n must be -1 (until end of generation) or a token count")


def print_perf(ctx: Context, t_load: float, t_sample: float, n_sampled: int) -> None:
    """llama.cpp's timing summary, on stderr."""
    p = ctx.perf
    total_ms = (time.perf_counter() - p.t_start) * 1e3 + t_load * 1e3

    def rate(ms: float, n: int) -> str:
        n = max(n, 1)
        return f"({ms / n:8.2f} ms per token, {1e3 * n / ms if ms > 0 else 0.0:8.2f} tokens per second)"

    lines = [
        f"llm_perf_print:    sampling time = {t_sample * 1e3:10.2f} ms / {max(n_sampled, 1):5d} runs",
        f"llm_perf_print:        load time = {t_load * 1e3:10.2f} ms",
        f"llm_perf_print: prompt eval time = {p.t_p_eval * 1e3:10.2f} ms / {max(p.n_p_eval, 1):5d} tokens "
        + rate(p.t_p_eval * 1e3, p.n_p_eval),
        f"llm_perf_print:        eval time = {p.t_eval * 1e3:10.2f} ms / {max(p.n_eval, 1):5d} runs   "
        + rate(p.t_eval * 1e3, p.n_eval),
        f"llm_perf_print:       total time = {total_ms:10.2f} ms / {p.n_p_eval + p.n_eval:5d} tokens",
    ]
    err_console.print("\n".join(lines), markup=False)
