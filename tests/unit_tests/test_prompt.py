"""nemo_gym.prompt: upstream's prompt templates, filled from a row's fields into its first messages."""

from __future__ import annotations

import json

import pytest

from nemo_gym.prompt import PromptConfig, apply_prompt_to_row, fill_prompt, load_prompt_config, materialize_prompts, validate_prompt_compatibility

TEMPLATE = PromptConfig(system="You answer {subject} questions.", user="Q: {question} Answer in {{braces}}.")


def test_fill_prompt_makes_the_system_then_the_user_message_from_the_rows_fields():
    assert fill_prompt(TEMPLATE, {"subject": "maths", "question": "2+2?"}) == [
        {"role": "system", "content": "You answer maths questions."},
        {"role": "user", "content": "Q: 2+2? Answer in {braces}."},
    ]
    assert fill_prompt(PromptConfig(user="{question}"), {"question": "hi"}) == [{"role": "user", "content": "hi"}]


def test_a_field_the_row_lacks_is_a_key_error_naming_it_and_the_rows_fields():
    with pytest.raises(KeyError, match=r"'subject'.*\['question'\]"):
        fill_prompt(TEMPLATE, {"question": "2+2?"})


def test_apply_prompt_to_row_sets_the_input_keeps_the_other_parameters_and_leaves_the_row_alone():
    row = {"subject": "maths", "question": "2+2?", "responses_create_params": {"temperature": 0.5}}
    applied = apply_prompt_to_row(row, TEMPLATE)
    assert applied["responses_create_params"] == {"temperature": 0.5, "input": fill_prompt(TEMPLATE, row)}
    assert row["responses_create_params"] == {"temperature": 0.5}


def test_rows_that_already_have_an_input_are_refused_by_index():
    rows = [{"question": "a"}, {"responses_create_params": {"input": "b"}}, {"responses_create_params": {"input": []}}, {"responses_create_params": {"input": "c"}}]
    with pytest.raises(ValueError, match=r"rows \[1, 3\]"):
        validate_prompt_compatibility(rows, TEMPLATE)


def test_a_relative_template_path_is_found_from_the_working_directory_and_read_once(tmp_path, monkeypatch):
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "p.yaml").write_text("user: 'Q: {question}'\n")
    monkeypatch.chdir(tmp_path)
    assert load_prompt_config("prompts/p.yaml") == PromptConfig(user="Q: {question}")
    (tmp_path / "prompts" / "p.yaml").write_text("user: changed\n")
    assert load_prompt_config("prompts/p.yaml").user == "Q: {question}"


def test_materialize_prompts_writes_every_row_with_its_input_and_the_template_used(tmp_path):
    (tmp_path / "prompt.yaml").write_text("user: 'Q: {question}'\n")
    (tmp_path / "raw.jsonl").write_text('{"question": "2+2?"}\n{"question": "3+3?"}\n')
    materialize_prompts(str(tmp_path / "raw.jsonl"), str(tmp_path / "prompt.yaml"), str(tmp_path / "out" / "rows.jsonl"))
    rows = [json.loads(line) for line in (tmp_path / "out" / "rows.jsonl").read_text().splitlines()]
    assert [row["responses_create_params"]["input"][0]["content"] for row in rows] == ["Q: 2+2?", "Q: 3+3?"]
    assert {row["prompt_config_used"] for row in rows} == {str(tmp_path / "prompt.yaml")}
