"""A page shows a text report rendered, never its Markdown: headings, tables, lists, paragraphs, escaped."""

from __future__ import annotations

from reusebench.report.markdown_html import to_html


def test_the_report_s_markdown_is_html_on_a_page() -> None:
    text = ("### Miss rates by class\n\n| turns | n |\n|-------|---|\n| first | 9 |\n\n- LoRA clear: 10\n- health: 5\n\n"
            "measured equals expected on every one of 73 requests <b>")
    assert to_html(text) == (
        "<h3>Miss rates by class</h3>\n<table><tr><th>turns</th><th>n</th></tr><tr><td>first</td><td>9</td></tr>"
        "</table>\n<ul><li>LoRA clear: 10</li><li>health: 5</li></ul>\n"
        "<p>measured equals expected on every one of 73 requests &lt;b&gt;</p>")
