"""`llm generate`: complete a prompt like llama-completion, streaming tokens to stdout."""

from __future__ import annotations

import inspect
import re
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Optional

import numpy as np
import typer

from llmsuite.core.chat import chat_prompt, probe_template, read_chat_template, read_vocab_size, resolve_template
from llmsuite.core.conversation import Conversation
from llmsuite.core.context import Context
from llmsuite.core.grammar import compile_grammar
from llmsuite.core.graph import AttnStats
from llmsuite.core.errors import InvalidInputError
from llmsuite.core.generation import (PROMPT_MARGIN, check_context_shift, check_prompt, generate as run_generation,
                                     stream_text)
from llmsuite.core.sampling import CHAIN, DEFAULT_SEED, DRY_BREAKERS, Sampler, SamplerParams, parse_samplers

from . import options as opt
from .common import err_console, log, open_model, read_text_file, resolve, settings
from .conversation import PROMPT_COLOR, colored, converse


Completions = Annotated[int, typer.Option("-np", "--parallel", help="completions of the prompt, in one batch")]


@opt.with_context_options(parallel=opt.Flag(Completions, 1))
def generate(
    model: opt.Model = None,
    prompt: Annotated[Optional[str], typer.Option("-p", "--prompt", help="prompt text")] = None,
    file: Annotated[Optional[Path], typer.Option("-f", "--file", help="read the prompt from a file")] = None,
    n_predict: Annotated[int, typer.Option("-n", "--n-predict", help="tokens to generate (-1: until end)")] = -1,
    *,
    context: opt.ContextOptions,
    seed: Annotated[int, typer.Option("-s", "--seed", help="sampling seed (random unless given)",
                                      show_default=False)] = DEFAULT_SEED,
    temp: Annotated[float, typer.Option("--temp", help="temperature: divide the logits by this (0: greedy)")] = 0.8,
    top_k: Annotated[int, typer.Option("--top-k", help="keep the k most likely tokens (0: all)")] = 40,
    top_p: Annotated[float, typer.Option("--top-p", help="keep the most likely tokens whose probabilities add up "
                                         "to p (1.0: all)")] = 0.95,
    min_p: Annotated[float, typer.Option("--min-p", help="drop tokens less likely than min-p times the most likely "
                                         "one (0.0: off)")] = 0.05,
    repeat_penalty: Annotated[float, typer.Option("--repeat-penalty", help="divide the logits of recent tokens "
                              "by this (1.0: off)")] = 1.0,
    repeat_last_n: Annotated[int, typer.Option("--repeat-last-n", help="recent tokens the penalties look at "
                             "(0: none, -1: the context)")] = 64,
    presence_penalty: Annotated[float, typer.Option("--presence-penalty", help="subtract this from the logit of "
                                "every recent token (0.0: off)")] = 0.0,
    frequency_penalty: Annotated[float, typer.Option("--frequency-penalty", help="subtract this times its count "
                                 "from the logit of every recent token (0.0: off)")] = 0.0,
    typical: Annotated[float, typer.Option("--typical", "--typical-p", help="locally typical sampling: keep the "
                       "tokens whose surprise is nearest the entropy, up to this much probability (1.0: off)")] = 1.0,
    top_n_sigma: Annotated[float, typer.Option("--top-nsigma", "--top-n-sigma", help="keep the logits within N "
                           "standard deviations of the largest (-1: off)")] = -1.0,
    xtc_probability: Annotated[float, typer.Option("--xtc-probability", help="exclude top choices: how often "
                               "(0.0: off)")] = 0.0,
    xtc_threshold: Annotated[float, typer.Option("--xtc-threshold", help="exclude top choices at or above this "
                             "probability but the least likely of them (> 0.5: off)")] = 0.1,
    dynatemp_range: Annotated[float, typer.Option("--dynatemp-range", help="dynamic temperature: --temp ± this, "
                              "by the candidates' entropy (0.0: off)")] = 0.0,
    dynatemp_exp: Annotated[float, typer.Option("--dynatemp-exp", help="dynamic temperature exponent")] = 1.0,
    grammar: Annotated[Optional[str], typer.Option("--grammar", help="a GBNF grammar (llama.cpp's format) the "
                       "output must follow")] = None,
    grammar_file: Annotated[Optional[Path], typer.Option("--grammar-file", help="read the GBNF grammar from a "
                            "file")] = None,
    json_schema: Annotated[Optional[str], typer.Option("-j", "--json-schema", help="a JSON schema the output "
                           "must follow (e.g. '{\"type\": \"object\"}')")] = None,
    json_schema_file: Annotated[Optional[Path], typer.Option("-jf", "--json-schema-file", help="read the JSON "
                                "schema from a file")] = None,
    dry_multiplier: Annotated[float, typer.Option("--dry-multiplier", help="DRY: penalize tokens that extend a "
                              "repetition by this · base^(length - allowed length) (0.0: off)")] = 0.0,
    dry_base: Annotated[float, typer.Option("--dry-base", help="DRY's base (values below 1 are ignored, as "
                        "llama.cpp)")] = 1.75,
    dry_allowed_length: Annotated[int, typer.Option("--dry-allowed-length", help="DRY: repetitions longer than "
                                  "this are penalized")] = 2,
    dry_penalty_last_n: Annotated[int, typer.Option("--dry-penalty-last-n", help="DRY: tokens scanned for "
                                  "repetitions (0: off)")] = 64,
    dry_sequence_breaker: Annotated[Optional[list[str]], typer.Option("--dry-sequence-breaker", help="a text "
                                    "that ends a repetition, in place of the defaults \\n : \" * (repeatable; "
                                    "'none': no breakers)")] = None,
    mirostat: Annotated[int, typer.Option("--mirostat", help="1 or 2: Mirostat v1/v2 in place of the sampler "
                        "chain (0: off)")] = 0,
    mirostat_lr: Annotated[float, typer.Option("--mirostat-lr", help="Mirostat's learning rate, eta")] = 0.1,
    mirostat_ent: Annotated[float, typer.Option("--mirostat-ent", help="Mirostat's target entropy, tau")] = 5.0,
    samplers: Annotated[str, typer.Option("--samplers", help="the sampler chain in order, ';'-separated, from "
                        "<samplers>")] = ";".join(CHAIN),
    ignore_eos: Annotated[bool, typer.Option("--ignore-eos", help="never sample end-of-generation tokens")] = False,
    logit_bias: Annotated[Optional[list[str]], typer.Option("-l", "--logit-bias", metavar="TOKEN_ID(+/-)BIAS",
                          help="add BIAS to a token's logit before sampling, e.g. 15043+1 or 15043-inf "
                          "(repeatable)")] = None,
    special: Annotated[bool, typer.Option("-sp", "--special", help="print special tokens as text")] = False,
    escape: Annotated[bool, typer.Option("-e/--no-escape", "--escape", show_default=False, help="turn \\n, \\t, "
                      "\\\\, \\\" in the prompt, -r, --in-prefix and --in-suffix into what they stand for "
                      "(on unless --no-escape)")] = True,
    verbose: opt.Verbose = False,
    chat: Annotated[bool, typer.Option("--chat", help="format the prompt with the model's chat template")] = False,
    system: Annotated[Optional[str], typer.Option("--system", "-sys", help="system message for --chat")] = None,
    system_file: Annotated[Optional[Path], typer.Option("-sysf", "--system-prompt-file", help="read the system "
                           "message from a file (one trailing newline dropped)")] = None,
    prompt_cache: Annotated[Optional[Path], typer.Option("--prompt-cache", help="state file to reuse the prompt from")] = None,
    display_prompt: Annotated[bool, typer.Option("--display-prompt/--no-display-prompt", help="echo the prompt "
                              "before the completion")] = True,
    conversation: Annotated[bool, typer.Option("-cnv/-no-cnv", "--conversation/--no-conversation",
                                               help="chat turn by turn over the chat template (llama-cli); -p is "
                                               "then the system message")] = False,
    single_turn: Annotated[bool, typer.Option("-st", "--single-turn", help="in -cnv/-i: answer one input, then "
                                              "exit")] = False,
    multiline_input: Annotated[bool, typer.Option("-mli", "--multiline-input", help="in -cnv/-i: every line "
                                                  "continues the input; a line ending in \\ or / ends it "
                                                  "(llama-cli's)")] = False,
    jinja: Annotated[bool, typer.Option("--jinja/--no-jinja", help="chat templates are always rendered with "
                                        "Jinja here (llama.cpp's --jinja; --no-jinja is noted and changes "
                                        "nothing)")] = True,
    interactive: Annotated[bool, typer.Option("-i", "--interactive", help="continue the prompt, then take "
                                              "input turn by turn as raw text")] = False,
    reverse_prompt: Annotated[Optional[list[str]], typer.Option("-r", "--reverse-prompt", help="stop when the "
                              "output comes to this text, shown up to it; in -cnv/-i: hand over to the user "
                              "there (repeatable)")] = None,
    in_prefix: Annotated[str, typer.Option("--in-prefix", help="in -cnv/-i: text put before each input")] = "",
    in_suffix: Annotated[str, typer.Option("--in-suffix", help="in -cnv/-i: text put after each input")] = "",
    chat_template: Annotated[Optional[str], typer.Option("--chat-template", help="chat template: a NAME (chatml) "
                             "or a Jinja FILE instead of the GGUF's (which falls back to chatml)")] = None,
    verbose_prompt: Annotated[bool, typer.Option("--verbose-prompt", help="print the prompt and its tokens "
                              "on stderr before generating")] = False,
    context_shift: Annotated[bool, typer.Option("--context-shift", help="when the context is full, drop half of "
                             "what follows --keep and go on (as llama.cpp's --context-shift)")] = False,
    keep: Annotated[int, typer.Option("--keep", help="with --context-shift: prompt tokens never dropped "
                    "(-1: all; BOS is always kept)")] = 0,
    color: Annotated[str, typer.Option("-co", "--color", help="on | off | auto (on where stdout is a terminal): "
                     "colour the prompt (yellow) and, in -cnv/-i, your input (green) apart from the generated "
                     "text")] = "auto",
) -> None:
    """Generate text from a prompt (llama-completion); -cnv chats turn by turn (llama-cli)."""
    opt.verbose_flag(verbose)
    color = opt.on_off_auto("--color", color, sys.stdout.isatty())
    system = _system_text(system, system_file)
    if not jinja:
        log("note: --no-jinja has no effect: chat templates are always rendered with Jinja here")
    text = _prompt_text(prompt, file)
    if escape:
        text, in_prefix, in_suffix = (opt.process_escapes(s) for s in (text, in_prefix, in_suffix))
        reverse_prompt = [opt.process_escapes(r) for r in reverse_prompt or ()]
    context = context.apply_llama_cpp_flags()
    chain = parse_samplers(samplers)
    default = SamplerParams()
    _check_mirostat(mirostat, samplers != ";".join(CHAIN), {
        "--top-k": top_k != default.top_k, "--top-p": top_p != default.top_p, "--min-p": min_p != default.min_p,
        "--typical": typical != default.typ_p, "--top-nsigma": top_n_sigma > 0, "--xtc-probability": xtc_probability > 0,
        "--dynatemp-range": dynatemp_range > 0, "--dry-multiplier": dry_multiplier != 0})
    biases = [_logit_bias(b) for b in logit_bias or ()]
    constraint = _grammar(grammar, grammar_file, json_schema, json_schema_file)
    if dry_penalty_last_n < 0:
        raise InvalidInputError(f"--dry-penalty-last-n must be >= 0, not {dry_penalty_last_n}")
    breakers = DRY_BREAKERS if dry_sequence_breaker is None else tuple(
        opt.process_escapes(b) for b in dry_sequence_breaker if b != "none")
    n_ctx, parallel = context.ctx_size, context.parallel
    if 0 < n_ctx <= PROMPT_MARGIN:  # known before the model loads
        raise InvalidInputError(f"-c {n_ctx} leaves no room for a prompt (generation keeps {PROMPT_MARGIN} cells "
                                "free beyond it, as llama-completion)")
    _check_sampling(temp, repeat_penalty, n_predict)
    talk = conversation or interactive
    _check_conversation_flags(conversation, interactive, chat, parallel, reverse_prompt, in_prefix, in_suffix)
    if (single_turn or multiline_input) and not talk:
        raise InvalidInputError("-st and -mli apply to -cnv and -i")
    if system is not None and not (chat or conversation):
        raise InvalidInputError("--system only applies with --chat or -cnv")
    params = context.params()
    template = None
    if chat or conversation:  # a template that fails is refused before the weights load
        path = resolve(model)
        template = resolve_template(read_chat_template(path), chat_template, path.name)
        probe_template(template, system if chat or system is not None else text, text if chat else "Hello")
        (log if template.from_model else err_console.print)(f"chat template: {template.origin}")
    if biases:  # a token outside the vocabulary is refused before the weights load
        n_vocab = read_vocab_size(resolve(model))
        outside = next((token for token, _ in biases if not 0 <= token < n_vocab), None)
        if outside is not None:
            raise InvalidInputError(f"-l/--logit-bias: token {outside} is outside the vocabulary (0..{n_vocab - 1})")
    lm, t_load = open_model(model, context.backend, (params.type_k, params.type_v), context.numerics)
    ctx = Context(lm, params)
    if settings["verbose"]:
        ctx.attn_stats = AttnStats()
    eog = tuple((t, -np.inf) for t in range(lm.vocab.n_tokens) if lm.vocab.is_eog(t)) if ignore_eos else ()
    sampler_params = SamplerParams(seed=seed, temp=temp, top_k=top_k, top_p=top_p, min_p=min_p,
                                   repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n,
                                   frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
                                   typ_p=typical, top_n_sigma=top_n_sigma, xtc_probability=xtc_probability,
                                   xtc_threshold=xtc_threshold, dynatemp_range=dynatemp_range,
                                   dynatemp_exponent=dynatemp_exp, mirostat=mirostat, mirostat_tau=mirostat_ent,
                                   mirostat_eta=mirostat_lr, grammar=constraint, chain=chain,
                                   dry_multiplier=dry_multiplier, dry_base=dry_base if dry_base >= 1.0 else default.dry_base,
                                   dry_allowed_length=dry_allowed_length, dry_penalty_last_n=dry_penalty_last_n,
                                   dry_sequence_breakers=breakers, logit_bias=tuple(biases) + eog)
    if talk:
        sampler = Sampler(sampler_params, ctx.backend, lm.vocab)
        if conversation:  # -p is the system message, as in llama-cli
            conv = Conversation(ctx, sampler, template, system=system if system is not None else text)
        else:
            conv = Conversation(ctx, sampler, None, prompt=text)
            sys.stdout.write(colored(text, PROMPT_COLOR, color) if display_prompt else "")
        turns = converse(conv, n_predict, tuple(reverse_prompt or ()), in_prefix, in_suffix + ("" if conversation else "\n"),
                         answer_first=interactive and bool(text), color=color, single_turn=single_turn,
                         multiline=multiline_input)
        print_perf(ctx, t_load, conv.t_sample, sum(len(t.tokens) for t in turns))
        return
    if chat:
        text = chat_prompt(lm, text, system, template)
    tokens = lm.vocab.tokenize(text, add_special=True, parse_special=True)
    if verbose_prompt:
        print_prompt(lm.vocab, text, tokens)
    check_prompt(ctx, tokens)
    if context_shift:
        check_context_shift(ctx, parallel)
    samplers = [Sampler(replace(sampler_params, seed=seed if seed == DEFAULT_SEED else seed + i), ctx.backend,
                        lm.vocab) for i in range(parallel)]
    shown = lm.vocab.detokenize(tokens, special=special) if display_prompt else ""  # as llama-completion echoes it
    log(f"sampler seed: {', '.join(str(s.seed) for s in samplers)}\n"
        f"sampler chain: {samplers[0].describe()}\n"
        f"memory: {ctx.memory.kind} ({ctx.kind}), {ctx.memory.nbytes / 2**20:.1f} MiB")
    try:
        results = _complete(ctx, samplers, tokens, n_predict, colored(shown, PROMPT_COLOR, color), prompt_cache,
                            special, keep if context_shift else None, tuple(reverse_prompt or ()))
    except KeyboardInterrupt:  # end the line, then the timings, as llama-completion does
        sys.stdout.write("\n")
        sys.stdout.flush()
        err_console.print("interrupted", markup=False)
        print_perf(ctx, t_load, 0.0, ctx.perf.n_eval)
        raise typer.Exit(130) from None
    if parallel > 1:
        for i, result in enumerate(results):
            sys.stdout.write(f"--- completion {i + 1}/{parallel} (seed {samplers[i].seed}) ---\n")
            text = result.text if result.text is not None else lm.vocab.detokenize(result.tokens, special=special)
            sys.stdout.write(shown + text + _ending(result))
    sys.stdout.flush()
    if any(r.stop == "context" for r in results):
        err_console.print("context full and context shift is disabled => stopping")
    print_perf(ctx, t_load, sum(r.t_sample for r in results), sum(len(r.tokens) for r in results))
    print_attn_stats(ctx)


def _complete(ctx, samplers, tokens, n_predict, shown_prompt, prompt_cache, special, n_keep, stops):
    if len(samplers) > 1:
        return run_generation(ctx, samplers, tokens, n_predict, prompt_cache=prompt_cache, report=log, n_keep=n_keep,
                              stops=stops, special=special)
    return _stream_one(ctx, samplers, tokens, n_predict, shown_prompt, prompt_cache, special, n_keep, stops)


def _stream_one(ctx, samplers, tokens, n_predict, shown_prompt, prompt_cache, special, n_keep, stops):
    sys.stdout.write(shown_prompt)
    sys.stdout.flush()
    pieces = stream_text(ctx, samplers[0], tokens, n_predict, special, stops, prompt_cache=prompt_cache, report=log,
                         n_keep=n_keep)
    while True:
        try:
            sys.stdout.write(next(pieces))
        except StopIteration as done:
            sys.stdout.write(_ending(done.value))
            return [done.value]
        sys.stdout.flush()


def _ending(result) -> str:
    return (" [end of text]\n" if result.stop == "eog" else "") + "\n"


def _grammar(gbnf: str | None, gbnf_file: Path | None, schema: str | None, schema_file: Path | None):
    """The one constraint given, compiled before the model loads (core.grammar), or None."""
    given = [(flag, value) for flag, value in (("--grammar", gbnf), ("--grammar-file", gbnf_file),
                                               ("-j", schema), ("-jf", schema_file)) if value is not None]
    if not given:
        return None
    if len(given) > 1:
        raise InvalidInputError(f"give one grammar: {given[0][0]} or {given[1][0]}, not both")
    flag, value = given[0]
    text = read_text_file(value) if isinstance(value, Path) else value
    origin = f"{flag} {value}" if isinstance(value, Path) else flag
    if flag in ("-j", "-jf"):
        return compile_grammar(json_schema=text, origin=origin)
    return compile_grammar(gbnf=text, origin=origin)


def _check_mirostat(version: int, chain_given: bool, samplers_set: dict[str, bool]) -> None:
    """Mirostat takes the place of the chain (as in llama.cpp, which ignores the rest silently)."""
    if version not in (0, 1, 2):
        raise InvalidInputError(f"--mirostat takes 0 (off), 1 or 2, not {version}")
    replaced = ["--samplers"] * chain_given + [flag for flag, given in samplers_set.items() if given]
    if version and replaced:
        raise InvalidInputError(f"--mirostat {version} replaces the sampler chain, {replaced[0]} among it: drop one")


def _logit_bias(text: str) -> tuple[int, float]:
    """llama.cpp's TOKEN_ID+BIAS or TOKEN_ID-BIAS."""
    match = re.fullmatch(r"\s*(\d+)\s*([+-])\s*(\S+)\s*", text)
    try:
        bias = float(match.group(3)) if match else None
    except ValueError:
        bias = None
    if bias is None or bias != bias:
        raise InvalidInputError(f"-l/--logit-bias takes TOKEN_ID+BIAS or TOKEN_ID-BIAS (15043+1), not '{text}'")
    return int(match.group(1)), -bias if match.group(2) == "-" else bias


def _system_text(system: str | None, file: Path | None) -> str | None:
    if system is not None and file is not None:
        raise InvalidInputError("give the system message with -sys or -sysf, not both")
    if file is None:
        return system
    text = read_text_file(file)
    return text[:-1] if text.endswith("\n") else text


def _prompt_text(prompt: str | None, file: Path | None) -> str:
    if prompt is not None and file is not None:
        raise InvalidInputError("give the prompt with -p or -f, not both")
    if file is not None:
        return read_text_file(file)
    return prompt or ""


def _check_conversation_flags(conversation: bool, interactive: bool, chat: bool, parallel: int, reverse_prompt,
                              in_prefix: str, in_suffix: str) -> None:
    if conversation and interactive:
        raise InvalidInputError("-cnv chats over the template and -i continues raw text: choose one")
    if (conversation or interactive) and parallel != 1:
        raise InvalidInputError("-cnv and -i hold one conversation: drop -np")
    if conversation and chat:
        raise InvalidInputError("--chat formats one prompt; -cnv formats every turn: choose one")
    if any(r == "" for r in reverse_prompt or ()):
        raise InvalidInputError("-r/--reverse-prompt cannot be empty")
    if not (conversation or interactive) and (in_prefix or in_suffix):
        raise InvalidInputError("--in-prefix and --in-suffix apply to -cnv and -i")


def _check_sampling(temp: float, repeat_penalty: float, n_predict: int) -> None:
    if temp < 0:
        raise InvalidInputError("--temp must be >= 0")
    if not repeat_penalty > 0:
        raise InvalidInputError("--repeat-penalty must be a positive number")
    if n_predict < -1:
        raise InvalidInputError("-n must be -1 (until end of generation) or a token count")


def print_prompt(vocab, text: str, tokens: list[int]) -> None:
    """--verbose-prompt: the prompt and each of its tokens, as llama-completion prints them."""
    pieces = [f"{t:6d} -> '{vocab.token_to_piece(t, special=True).decode('utf-8', errors='replace')}'"
              for t in tokens]
    err_console.print(f"prompt: '{text}'\nnumber of tokens in prompt = {len(tokens)}\n" + "\n".join(pieces),
                      markup=False)


def print_attn_stats(ctx: Context) -> None:
    """Under -v: per layer, the mask that ran, the kernel path, the kept share and the time."""
    if ctx.attn_stats is not None and ctx.attn_stats.layers:
        err_console.print("attention per layer:\n" + "\n".join(ctx.attn_stats.lines()), markup=False)


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


def chat(**options) -> None:
    """Chat with a model turn by turn (llama-cli's conversation: llm generate -cnv)."""
    generate(**options, conversation=True)


# generate's options, less -cnv, as Typer reads them (annotations evaluated: this module's are strings)
_options = inspect.signature(generate, eval_str=True)
chat.__signature__ = _options.replace(parameters=[p for p in _options.parameters.values() if p.name != "conversation"])
