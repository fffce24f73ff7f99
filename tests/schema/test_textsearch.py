"""The text search configuration of a page's language, shared by the recorder and search."""

from __future__ import annotations

import pytest

from trove_schema.textsearch import ts_config


@pytest.mark.parametrize(
    ("language", "config"),
    [("en", "english"), ("pt-BR", "portuguese"), ("FR", "french"), ("nb", "norwegian"),
     ("xx", "simple"), ("", "simple"), (None, "simple")],
)  # fmt: skip
def test_a_language_gets_its_configuration_or_simple(language: str | None, config: str) -> None:
    assert ts_config(language) == config
