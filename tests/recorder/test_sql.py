from __future__ import annotations

import pytest

from trove_recorder.sql import Statement, copy_text


def test_named_parameters_become_numbered_ones_each_name_once() -> None:
    statement = Statement(
        "SELECT :a, CAST(:b AS text[]), :a, x::int FROM t WHERE y = ANY(:b) AND z = :c_2"
    )
    assert (
        statement.sql
        == "SELECT $1, CAST($2 AS text[]), $1, x::int FROM t WHERE y = ANY($2) AND z = $3"
    )
    assert statement.args({"c_2": 3, "b": ["x"], "a": 1}) == [1, ["x"], 3]


def test_a_missing_parameter_is_an_error_not_a_null() -> None:
    with pytest.raises(KeyError, match="b"):
        Statement("SELECT :a, :b").args({"a": 1})


def test_copy_text_escapes_what_would_end_a_field_or_a_row() -> None:
    assert copy_text("a\tb\nc\rd\\e") == "a\\tb\\nc\\rd\\\\e"
