"""The end-of-crawl report prints what came from the web as text, never as markup."""

from __future__ import annotations

import io

from rich.console import Console

from trove_cli.report import Report, render


def test_titles_urls_and_seeds_with_brackets_are_printed_as_they_are() -> None:
    report = Report(
        top_linked=[
            ("https://example.org/r/[python]", "Subreddit [/r/python] and a [/] b", 3),
            ("https://example.org/annual.pdf", "[pdf] Annual report", 2),
        ],
        rejected_seeds=[("https://x/?q=[/x]", "host [b]x[/b] is not a domain")],
    )
    out = io.StringIO()
    render(report, Console(file=out, width=200))
    printed = out.getvalue()
    assert "Subreddit [/r/python] and a [/] b" in printed
    assert "[pdf] Annual report" in printed
    assert "https://example.org/r/[python]" in printed
    assert "https://x/?q=[/x]" in printed
    assert "host [b]x[/b] is not a domain" in printed
