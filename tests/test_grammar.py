"""Constrained output through llguidance: GBNF (llama.cpp's grammars) and JSON schemas."""

import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import real_model
from llmsuite.core.context import Context, ContextParams
from llmsuite.core.conversation import Conversation
from llmsuite.core.errors import InvalidInputError
from llmsuite.core.generation import generate
from llmsuite.core.grammar import compile_grammar
from llmsuite.core.sampling import Sampler, SamplerParams
from test_cli import assert_one_line_error

LLM = [sys.executable, "-m", "llmsuite.cli.main"]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


def llm(*args):
    return subprocess.run(LLM + list(args), capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)


def follows_schema(value) -> bool:
    return (isinstance(value, dict) and set(value) == {"name", "age"} and isinstance(value["name"], str)
            and len(value["name"]) <= 12 and isinstance(value["age"], int))


@pytest.mark.parametrize("sampling", [["--temp", "0"], ["--temp", "1.0", "-s", "7"]], ids=["greedy", "sampled"])
def test_json_schema_output_parses_and_follows_the_schema(sampling):
    prompt = "A person, as JSON:"
    r = llm("generate", "-p", prompt, "-n", "96", "-j", json.dumps(SCHEMA), *sampling)
    assert r.returncode == 0, r.stderr
    text = r.stdout.removeprefix(prompt).rstrip("\n").removesuffix(" [end of text]")
    assert " [end of text]" in r.stdout  # the grammar ends there: only end-of-generation is left
    assert follows_schema(json.loads(text)), text


def test_a_gbnf_grammar_holds_in_every_sequence_of_a_batch_and_every_answer_of_a_conversation():
    model = real_model("smollm2-135m")
    grammar = compile_grammar(gbnf='root ::= " " ("yes" | "no") "."')
    params = SamplerParams(temp=1.0, seed=3, grammar=grammar)
    prompt = model.vocab.tokenize("Is the sky blue? Answer:", add_special=True)
    samplers = [Sampler(SamplerParams(temp=1.0, seed=3 + i, grammar=grammar), vocab=model.vocab) for i in range(3)]
    results = generate(Context(model, ContextParams(n_ctx=256, n_seq_max=3)), samplers, prompt, 16)
    texts = [model.vocab.detokenize(r.tokens) for r in results]
    assert all(t in (" yes.", " no.") for t in texts) and all(r.stop == "eog" for r in results), texts
    conv = Conversation(Context(model, ContextParams(n_ctx=512)), Sampler(params, vocab=model.vocab), None,
                        prompt="Q: Is water wet?\nA:")
    for question in ("\nQ: Is fire cold?\nA:", "\nQ: Is ice cold?\nA:"):
        conv.feed()
        assert conv.answer(16).text in (" yes.", " no.")
        conv.add_user(question)


def test_the_mask_keeps_exactly_the_tokens_the_grammar_allows():
    model = real_model("smollm2-135m")
    sampler = Sampler(SamplerParams(temp=0.0, grammar=compile_grammar(gbnf='root ::= "ab" | "ac"')),
                      vocab=model.vocab)
    first = sampler.matcher.allowed()
    pieces = {model.vocab.token_to_piece(int(t), True) for t in np.flatnonzero(first)}
    assert pieces and all(p in (b"a", b"ab", b"ac") for p in pieces)  # every token that starts a valid text
    token = sampler.sample(np.zeros(model.vocab.n_tokens, np.float32))
    assert model.vocab.token_to_piece(token, True) in pieces


@pytest.mark.parametrize("args, fragment", [
    (["--grammar", 'root ::= ( "a" '], "--grammar: line 1, column 16: Expected ')'"),
    (["--grammar", 'root ::= "a"\nfoo ::= [a-'], "line 2, column 12"),
    (["--grammar", 'root ::= "a" b'], "Rule 'b' not found"),
    (["-j", '{"type": "object",'], "-j: not JSON: Expecting property name enclosed in double quotes at line 1, column 19"),
    (["-j", '{"type": "objectx"}'], "Invalid type: objectx"),
    (["-j", "{}", "--grammar", 'root ::= "a"'], "give one grammar"),
])
def test_bad_grammars_are_one_sentence_before_the_model_loads(args, fragment):
    assert_one_line_error(llm("generate", "-m", "/no/such/model.gguf", "-p", "hi", *args), fragment)


def test_compile_refuses_in_one_sentence():
    with pytest.raises(InvalidInputError, match="line 1, column 16"):
        compile_grammar(gbnf='root ::= ( "a" ')
