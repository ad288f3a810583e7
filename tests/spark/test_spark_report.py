"""The HTML report renders without Spark: self-contained, escaped, one SVG per chart."""

from __future__ import annotations

from datetime import UTC, datetime

from vibemq_server.spark.report import ReportData, bar_chart, line_chart, render


def test_report_is_self_contained_and_escaped() -> None:
    data = ReportData(
        source="/data/<x>",
        per_minute=[
            {"minute": datetime(2026, 1, 1, 0, m, tzinfo=UTC), "published": 10 * m, "acked": 9 * m}
            for m in range(5)
        ],
        queue_totals=[{"queue": "a&b", "published": 100, "acked": 90}],
        latency=[{"queue": "a&b", "messages": 90, "p50_ms": 3.0, "p95_ms": 9.5, "p99_ms": 20.0}],
        redeliveries=[{"deliveries": 1, "messages": 80}, {"deliveries": 2, "messages": 10}],
        dead_letters=[{"queue": "a&b", "reason": "MaxRetriesExceeded", "messages": 3}],
        payload_sizes=[{"size_bucket": 128, "messages": 90}],
    )
    page = render(data)
    assert page.startswith("<!DOCTYPE html>")
    assert page.count("<svg") == 5
    assert "<script" not in page and "<link" not in page
    assert "a&amp;b" in page and "a&b" not in page and "/data/&lt;x&gt;" in page
    assert "2026-01-01 00:04" in page
    # Counts print as whole numbers; the latency chart has every percentile.
    assert 'class="l">80<' in page and ">80.0<" not in page
    assert "1 delivery<" in page and "2 deliveries<" in page
    assert "a&amp;b p50" in page and "a&amp;b p95" in page and "a&amp;b p99" in page


def test_charts_handle_empty_and_zero_data() -> None:
    assert "(none)" in bar_chart("nothing", [])
    svg = line_chart("flat", ["a"], {"s": [0.0]})
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    assert "<svg" in render(ReportData())
