"""The dashboard's script inserts broker data as text only: none of the DOM's ways to turn a
string into markup or code appears in it (the browser tests show a hostile payload as text;
this keeps the next change from adding a way in). Its vendored chart library is not ours to
edit and is left out; its licence must travel with it."""

from __future__ import annotations

import re

from vibemq_server.http.dashboard import ROOT

#: string -> markup or code
SINKS = re.compile(
    r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|\beval\s*\(|new\s+Function\s*\("
    r"|setAttribute\(\s*[\"']on|\.srcdoc\b"
)


def test_the_script_never_turns_data_into_markup() -> None:
    script = (ROOT / "app.js").read_text()
    code = re.sub(r"/\*.*?\*/|//[^\n]*", "", script, flags=re.S)  # comments may name them
    assert SINKS.findall(code) == []


def test_the_page_has_no_inline_script_or_style() -> None:
    page = (ROOT / "index.html").read_text()
    assert re.findall(r"<script(?![^>]*\bsrc=)[^>]*>", page) == []
    assert "<style" not in page.lower()
    assert re.findall(r"<[^>]*\s(?:style|on\w+)\s*=", page, flags=re.I) == []


def test_the_vendored_library_keeps_its_licence() -> None:
    licence = (ROOT / "vendor" / "uPlot.LICENSE").read_text()
    assert "MIT License" in licence and "Leon Sorokin" in licence
    assert (ROOT / "vendor" / "uPlot.iife.min.js").stat().st_size > 10_000
