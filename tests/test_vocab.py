from functools import lru_cache

import pytest

from conftest import REAL_MODELS, load_fixture
from llmsuite.core.gguf import GGUFFile
from llmsuite.core.hub import resolve_model
from llmsuite.core.vocab import Vocab, regex_split


@lru_cache(maxsize=None)
def vocab(name: str) -> Vocab:
    return Vocab(GGUFFile(resolve_model(name)))


@pytest.mark.parametrize("name", REAL_MODELS)
def test_tokenize_matches_llama_cpp(name):
    cases = load_fixture(f"real/{name}.tokenize.json")["cases"]
    mismatches = [(c["text"], c["add_special"]) for c in cases
                  if vocab(name).tokenize(c["text"], add_special=c["add_special"], parse_special=False) != c["ids"]]
    assert not mismatches
    assert len(cases) == 36


@pytest.mark.parametrize("name", REAL_MODELS)
def test_corpus_prefix_matches_logits_fixture(name):
    """The 96 ids llama.cpp decoded for the logits fixture are the start of hamlet.md's tokenization."""
    fixture = load_fixture(f"real/{name}.logits.json")
    text = vocab(name).detokenize(fixture["ids"])
    assert vocab(name).tokenize(text, add_special=True)[:90] == fixture["ids"][:90]


@pytest.mark.parametrize("name", REAL_MODELS)
@pytest.mark.parametrize("text", ["Hello world", "Ünïcödé àccents: café", "Emoji 🦙🚀 ∑∫√", "tabs\tand\nlines  x"])
def test_detokenize_round_trip(name, text):
    v = vocab(name)
    assert v.detokenize(v.tokenize(text, add_special=False)) == text


def test_bos_per_model():
    assert vocab("gemma3-270m").tokenize("a", add_special=True)[0] == vocab("gemma3-270m").bos == 2
    assert vocab("smollm2-135m").tokenize("a", add_special=True) == vocab("smollm2-135m").tokenize("a", False)


def test_parse_special_controls_control_tokens():
    v = vocab("smollm2-135m")
    assert v.tokenize("<|im_start|>user", add_special=False, parse_special=True)[0] == 1
    plain = v.tokenize("<|im_start|>user", add_special=False, parse_special=False)
    assert len(plain) > 2 and plain[0] != 1


def test_end_of_generation_tokens():
    assert vocab("smollm2-135m").eog >= {0, 2}
    assert vocab("gemma3-270m").eog >= {1, 106}  # <eos>, <end_of_turn>


def test_control_tokens_print_nothing_unless_special():
    v = vocab("gemma3-270m")
    assert v.token_to_piece(106) == b""
    assert v.token_to_piece(106, special=True) == b"<end_of_turn>"


def test_streamer_holds_back_partial_utf8():
    v = vocab("gemma3-270m")
    ids = v.tokenize("🦙", add_special=False)
    pieces = [v.token_to_piece(t) for t in ids]
    assert len(ids) > 1 and all(len(p) == 1 for p in pieces)  # byte fallback tokens
    streamer = v.streamer()
    out = [streamer.push(t) for t in ids]
    assert out[:-1] == [""] * (len(ids) - 1) and out[-1] == "🦙"


def test_regex_split_keeps_gaps():
    assert regex_split("ab12c", [r"\p{N}"]) == ["ab", "1", "2", "c"]
    assert regex_split("", [r"\p{N}"]) == []


@pytest.mark.parametrize("pre, text, pieces", [
    ("llama3", "I'M 12345 apples\n\n", ["I", "'M", " ", "123", "45", " apples", "\n\n"]),
    ("qwen2", "x 12345", ["x", " ", "1", "2", "3", "4", "5"]),
    ("gpt-2", "it's  ok!!", ["it", "'s", " ", " ok", "!!"]),
    ("smollm", "a12 b", ["a", "1", "2", " b"]),
])
def test_pre_tokenizer_regexes(pre, text, pieces):
    from llmsuite.core.vocab import _PRE_TOKENIZERS

    assert regex_split(text, _PRE_TOKENIZERS[pre][0]) == pieces
