"""The built-in suites of Spec-Bench's kinds (multi-turn, translation, summarisation, QA, maths,
RAG) and the `messages` prompt: a whole conversation rendered with the model's chat template."""

import json
import re

import pytest
from clihelp import specli

from specli.engine import Model
from specli.errors import SpecliError
from specli.measure.suite import BUILTIN_SUITES, load_suite, parse_suite
from specli.prompt import build_prompt, prompt_tokens, render_chat, tokenize_prompt

KINDS = ("multiturn", "translation", "summarise", "qa", "maths", "rag")
LICENCE = re.compile(r"CC0|CC BY|public domain|public-domain|United Nations", re.IGNORECASE)


@pytest.fixture(scope="module")
def vocab(tiny_target):
    """The tiny target's vocabulary and header: SmolLM2's tokenizer and chat template."""
    return Model(tiny_target, vocab_only=True)


def test_every_builtin_suite_loads_with_unique_ids_and_names_its_licence():
    assert set(KINDS) <= set(BUILTIN_SUITES)
    for name in BUILTIN_SUITES:
        s = load_suite(name)
        assert s.name == name and s.prompts
        ids = [p.id for p in s.prompts]
        assert len(set(ids)) == len(ids), name
        assert LICENCE.search(s.description), f"{name}: description names no licence"
        assert all(p.text.strip() for p in s.prompts)
    for name in KINDS:
        s = load_suite(name)
        assert len(s.prompts) >= 4, name
        assert all(p.temperature == 0 for p in s.prompts), f"{name} must be greedy"
        assert all(bool(p.messages) == (name == "multiturn") for p in s.prompts), name


def test_summarise_passages_are_250_to_400_words():
    for p in load_suite("summarise").prompts:
        passage = p.text.split("\n", 2)[2]
        assert 250 <= len(passage.split()) <= 400, p.id


def test_multiturn_prompts_are_conversations_ending_with_the_user():
    for p in load_suite("multiturn").prompts:
        roles = [r for r, _ in p.messages]
        assert roles[-1] == "user" and "assistant" in roles
        assert p.text == p.messages[-1][1]


def test_messages_parse_from_yaml_and_jsonl():
    convo = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a prime."},
             {"role": "assistant", "content": "7"}, {"role": "user", "content": "Another?"}]
    s = parse_suite(json.dumps({"id": "c", "messages": convo}) + "\n", "mine.jsonl", "mine")
    p = s.prompts[0]
    assert p.messages == (("system", "Be brief."), ("user", "Name a prime."), ("assistant", "7"),
                          ("user", "Another?"))
    assert p.text == "Another?" and p.id == "c"
    y = parse_suite("prompts:\n  - id: y\n    max_tokens: 8\n    messages:\n"
                    "      - {role: user, content: Hi}\n", "mine.yaml", "mine").prompts[0]
    assert y.messages == (("user", "Hi"),) and y.max_tokens == 8


@pytest.mark.parametrize("messages, fragment", [
    ([], "non-empty list"),
    ("hello", "non-empty list"),
    ([{"role": "robot", "content": "Hi"}], "role 'robot'"),
    ([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}], "end with a user"),
    ([{"role": "user", "content": "Hi"}, {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Hi"}], "only the first"),
    ([{"role": "user"}], "exactly 'role' and 'content'"),
    ([{"role": "user", "content": "Hi", "name": "x"}], "exactly 'role' and 'content'"),
    (["Hi"], "exactly 'role' and 'content'"),
    ([{"role": "user", "content": "  "}], "no content"),
    ([{"role": "user", "content": 3}], "no content"),
])
def test_bad_messages_are_one_line_errors(messages, fragment):
    with pytest.raises(SpecliError) as e:
        parse_suite(json.dumps({"prompts": [{"id": "x", "messages": messages}]}), "bad.yaml", "bad")
    msg = str(e.value)
    assert "\n" not in msg and fragment in msg and msg.startswith("bad.yaml: prompt 1"), msg


def test_messages_and_text_together_is_an_error():
    with pytest.raises(SpecliError, match="has both 'text' and 'messages'"):
        parse_suite(json.dumps({"prompts": [{"text": "a", "messages": [{"role": "user", "content": "b"}]}]}),
                    "bad.yaml", "bad")


def test_prompt_tokens_render_the_whole_conversation(vocab):
    p = next(p for p in load_suite("multiturn").prompts if p.id == "mutable-default")
    toks = prompt_tokens(vocab, p, chat=True)
    msgs = [{"role": r, "content": c} for r, c in p.messages]
    rendered = render_chat(vocab.chat_template(), msgs, vocab.detokenize([vocab.bos], special=True),
                           vocab.detokenize([vocab.eos], special=True))
    assert toks == tokenize_prompt(vocab, rendered, templated=True)
    # every turn is there, in order, each once, and the template's assistant header ends it
    text = vocab.detokenize(toks, special=True)
    at = [text.index(c) for _, c in p.messages]
    assert at == sorted(at) and all(text.count(c) == 1 for _, c in p.messages)
    assert text.rstrip().endswith("assistant")
    # longer than the last user turn alone
    assert len(toks) > len(build_prompt(vocab, p.text, True))


def test_prompt_tokens_of_a_text_prompt_are_build_prompt(vocab):
    p = load_suite("qa").prompts[0]
    for chat in (True, False):
        assert prompt_tokens(vocab, p, chat) == build_prompt(vocab, p.text, chat)


def test_a_conversation_without_a_chat_template_is_a_one_line_error(vocab, monkeypatch):
    p = load_suite("multiturn").prompts[0]
    with pytest.raises(SpecliError) as e:
        prompt_tokens(vocab, p, chat=False)
    assert "\n" not in str(e.value) and "'messages'" in str(e.value) and p.id in str(e.value)
    monkeypatch.setattr(vocab, "chat_template", lambda: None)
    with pytest.raises(SpecliError, match="has no chat template") as e:
        prompt_tokens(vocab, p, chat=False)
    assert "\n" not in str(e.value)


def test_bench_runs_a_conversation_suite(tmp_path, tiny_target):
    suite = tmp_path / "convo.yaml"
    suite.write_text(json.dumps({"prompts": [
        {"id": "two-turns", "messages": [{"role": "user", "content": "Say hello."},
                                         {"role": "assistant", "content": "Hello."},
                                         {"role": "user", "content": "Say it again."}]},
        {"id": "plain", "text": "Once upon a time"}]}))
    rc, out, err = specli("bench", "--target", tiny_target, "--draft", "lookup", "--suite", str(suite),
                          "-n", "8", "--modes", "none,lookup", "--json")
    assert rc == 0, err
    data = json.loads(out)
    assert set(data["modes"]["none"]["per_prompt"]) == {"two-turns", "plain"}
