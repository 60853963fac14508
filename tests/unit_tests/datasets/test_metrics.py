"""nemo_gym.datasets.metrics: upstream's statistics of a task dataset: each row's request numbers, and its other
fields (numbers summarised, strings counted)."""

from __future__ import annotations

import pytest

from nemo_gym.datasets.metrics import other_fields, request_columns, request_metrics, rounded, summary

WORDS = "Json-dumped number of words (proxy for token count)"


def test_a_summary_is_upstreams_five_numbers_and_zeros_for_an_empty_column():
    assert summary([1.0, 2.0, 4.0]) == {"Total # non-null values": 3, "Average": 2.33, "Min": 1.0, "Max": 4.0, "Standard deviation": 1.53}
    assert summary([0.5]) == {"Total # non-null values": 1, "Average": 0.5, "Min": 0.5, "Max": 0.5, "Standard deviation": 0.0}
    assert summary([]) == {"Total # non-null values": 0, "Average": 0.0, "Min": 0.0, "Max": 0.0, "Standard deviation": 0.0}


@pytest.mark.parametrize("value, kept", [(1.23456, 1.23), (-12.345, -12.35), (0.12345, 0.123), (-0.0004, -0.0)])
def test_a_value_keeps_two_decimals_from_one_up_and_three_below(value, kept):
    assert rounded(value) == kept


def test_a_rows_request_counts_its_tools_user_turns_temperature_and_words():
    params = {"input": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}], "tools": [], "temperature": 0.5}
    columns = request_columns({"responses_create_params": params})
    assert {key: value for key, value in columns.items() if key != WORDS} == {"Number of tools": 0.0, "Number of turns": 2.0, "Temperature": 0.5}
    assert columns[WORDS] > 0


def test_a_string_input_is_one_user_turn_and_unset_numbers_are_left_out():
    assert set(request_columns({"responses_create_params": {"input": "hello there"}})) == {WORDS, "Number of turns"}


@pytest.mark.parametrize("row", [{}, {"responses_create_params": "not a request"}, {"responses_create_params": {"input": 3}}])
def test_a_row_that_is_no_task_has_no_request_columns(row):
    assert request_columns(row) is None


def test_other_fields_summarise_numbers_count_strings_and_leave_the_request_out():
    rows = [
        {"responses_create_params": {"input": "q"}, "difficulty": 1, "tags": ["a", "b"], "ok": True},
        {"responses_create_params": {"input": "q"}, "difficulty": 3, "tags": ["a"], "ok": False, "notes": None},
    ]
    fields = other_fields(rows)
    assert set(fields) == {"difficulty", "tags", "ok"}
    assert fields["difficulty"]["Average"] == 2.0 and fields["ok"]["Total # non-null values"] == 2
    assert fields["tags"] == {"unique_count": 2, "total_count": 3}


def test_request_metrics_count_the_examples_and_summarise_each_column_over_the_rows_that_have_it():
    metrics = request_metrics([{WORDS: 2.0, "Number of tools": 1.0}, {WORDS: 4.0}])
    assert metrics["Number of examples"] == 2
    assert metrics[WORDS]["Average"] == 3.0 and metrics["Number of tools"]["Total # non-null values"] == 1
    assert metrics["Temperature"]["Total # non-null values"] == 0
