"""Small input faults: a bench suite written with the common keys of other tools' prompt sets
(`prompt`, multi-turn `turns`), and prompt text that is not UTF-8 (a file, standard input)."""

import json

import pytest
from clihelp import specli

from specli.cli.common import read_prompt
from specli.errors import SpecliError
from specli.measure.suite import load_suite, parse_suite


def _jsonl(*rows) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def test_suite_accepts_prompt_as_well_as_text():
    s = parse_suite(_jsonl({"prompt": "Write a haiku."}, {"id": "b", "text": "Say hi.", "max_tokens": 8}),
                    "mine.jsonl", "mine")
    assert [(p.id, p.text) for p in s.prompts] == [("p1", "Write a haiku."), ("b", "Say hi.")]
    s = parse_suite("prompts:\n  - prompt: Explain recursion.\n    temperature: 0.5\n", "mine.yaml", "mine")
    assert s.prompts[0].text == "Explain recursion." and s.prompts[0].temperature == 0.5


def test_suite_takes_the_first_turn_of_a_multi_turn_set(tmp_path):
    # MT-Bench / Spec-Bench question.jsonl: question_id, category, turns (strings)
    f = tmp_path / "question.jsonl"
    f.write_text(_jsonl(
        {"question_id": 81, "category": "writing", "turns": ["Compose a travel blog post.", "Rewrite it."]},
        {"question_id": 82, "category": "chat", "turns": [{"role": "system", "content": "Be brief."},
                                                          {"role": "user", "content": "Name a prime."},
                                                          {"role": "assistant", "content": "7"},
                                                          {"role": "user", "content": "Another?"}]},
        {"question_id": 83, "turns": [{"content": "Only content here."}]},
    ))
    s = load_suite(str(f))
    assert s.name == "question"
    assert [(p.id, p.text) for p in s.prompts] == [("81", "Compose a travel blog post."), ("82", "Name a prime."),
                                                   ("83", "Only content here.")]


@pytest.mark.parametrize("row, msg", [
    ({"text": "a", "prompt": "b"}, "has both 'text' and 'prompt'"),
    ({"turns": []}, "'turns' must be a non-empty list"),
    ({"turns": [1, 2]}, "'turns' entries must be strings, or mappings with 'content'"),
    ({"turns": [{"role": "system", "content": "x"}]}, "'turns' has no user turn"),
    ({"prompt": "  "}, "has no text (give 'text', 'prompt', 'turns' or 'messages')"),
    ({"prompt": "a", "temprature": 1}, "unknown key 'temprature'"),
])
def test_suite_refuses_bad_prompts_in_one_line(row, msg):
    with pytest.raises(SpecliError) as e:
        parse_suite(_jsonl(row), "mine.jsonl", "mine")
    assert msg in str(e.value) and str(e.value).startswith("mine.jsonl:1: prompt 1") and "\n" not in str(e.value)


def test_a_prompt_file_not_in_utf8_says_how_to_convert_it(tmp_path):
    f = tmp_path / "latin1.txt"
    f.write_bytes("Résumé: café\n".encode("latin-1"))
    with pytest.raises(SpecliError) as e:
        read_prompt(None, str(f))
    msg = str(e.value)
    assert msg.startswith(f"prompt file {f} is not UTF-8 text (byte 0xe9 at offset 1)") and "\n" not in msg
    assert "expects UTF-8" in msg and f"iconv -f LATIN1 -t UTF-8 {f} >" in msg
    # UTF-16 (what Windows PowerShell's `>` writes) is named as such
    f.write_bytes("hello".encode("utf-16"))
    with pytest.raises(SpecliError, match="iconv -f UTF-16 -t UTF-8"):
        read_prompt(None, str(f))
    # UTF-8, with or without a byte-order mark, and CRLF line ends read as text mode reads them
    f.write_bytes("\ufeffcafé\r\nnext\n".encode("utf-8"))
    assert read_prompt(None, str(f)) == "café\nnext\n"


def test_standard_input_not_in_utf8_is_one_line_with_the_fix():
    rc, out, err = specli("run", "--target", "no-such-model.gguf", stdin="Résumé: café\n".encode("latin-1"))
    assert rc == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith("specli: error: standard input is not UTF-8 text (byte 0xe9")
    assert "expects UTF-8" in err and "iconv -f LATIN1 -t UTF-8 prompt.txt | specli run" in err
