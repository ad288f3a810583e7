"""Self-contained HTML report of the analytics job: inline SVG charts, no JavaScript, no CDN.

Pure Python (no pyspark): the job collects the small aggregated tables and hands them here as
plain lists of dicts, so the rendering is unit-tested without Spark.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

Table = Sequence[Mapping[str, Any]]

COLOURS = ("#2563eb", "#16a34a", "#f59e0b", "#dc2626", "#7c3aed", "#0891b2")
WIDTH, HEIGHT, PAD = 760, 260, 48


@dataclass
class ReportData:
    title: str = "VibeMQ journal report"
    source: str = ""
    generated_at: str = field(
        default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds")
    )
    per_minute: Table = ()  # minute (datetime or str), published, delivered, acked, ...
    queue_totals: Table = ()  # queue, published, delivered, acked, dead_lettered, expired, ...
    latency: Table = ()  # queue, messages, p50_ms, p95_ms, p99_ms, mean_ms, max_ms
    redeliveries: Table = ()  # deliveries, messages (all queues)
    dead_letters: Table = ()  # queue, reason, messages
    payload_sizes: Table = ()  # size_bucket (upper bound, bytes), messages (all queues)


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _num(value: Any) -> float:
    try:
        return float(value or 0)
    except (TypeError, ValueError):
        return 0.0


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        # Counts arrive as floats from the charts: no ".0" on a whole number.
        return f"{int(value):,}" if value.is_integer() else f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M")
    return "" if value is None else str(value)


def line_chart(title: str, x_labels: Sequence[str], series: Mapping[str, Sequence[float]]) -> str:
    """An SVG line chart, one polyline per series, with a legend."""
    n = len(x_labels)
    top = max([max(values, default=0) for values in series.values()] + [1])
    inner_w, inner_h = WIDTH - 2 * PAD, HEIGHT - 2 * PAD
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT + 24}" '
        f'role="img" aria-label="{_esc(title)}">',
        f'<text x="{PAD}" y="18" class="t">{_esc(title)}</text>',
        f'<line x1="{PAD}" y1="{HEIGHT - PAD}" x2="{WIDTH - PAD}" y2="{HEIGHT - PAD}" class="a"/>',
        f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{HEIGHT - PAD}" class="a"/>',
        f'<text x="{PAD - 4}" y="{PAD + 4}" class="l" text-anchor="end">{_fmt(int(top))}</text>',
        f'<text x="{PAD - 4}" y="{HEIGHT - PAD}" class="l" text-anchor="end">0</text>',
    ]
    if n:
        parts.append(
            f'<text x="{PAD}" y="{HEIGHT - PAD + 16}" class="l">{_esc(x_labels[0])}</text>'
        )
        parts.append(
            f'<text x="{WIDTH - PAD}" y="{HEIGHT - PAD + 16}" class="l" text-anchor="end">'
            f"{_esc(x_labels[-1])}</text>"
        )
    for i, (name, values) in enumerate(series.items()):
        colour = COLOURS[i % len(COLOURS)]
        points = " ".join(
            f"{PAD + (inner_w * j / max(n - 1, 1)):.1f},{HEIGHT - PAD - inner_h * v / top:.1f}"
            for j, v in enumerate(values)
        )
        parts.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{points}"/>'
        )
        lx = PAD + i * 130
        parts.append(f'<rect x="{lx}" y="{HEIGHT + 6}" width="10" height="10" fill="{colour}"/>')
        parts.append(f'<text x="{lx + 14}" y="{HEIGHT + 15}" class="l">{_esc(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def bar_chart(title: str, bars: Sequence[tuple[str, float]], unit: str = "") -> str:
    """A horizontal SVG bar chart with the value at the end of each bar."""
    row_h = 22
    height = 30 + row_h * max(len(bars), 1)
    label_w = 200
    top = max([v for _, v in bars] + [1])
    inner = WIDTH - label_w - 90
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'role="img" aria-label="{_esc(title)}">',
        f'<text x="4" y="18" class="t">{_esc(title)}</text>',
    ]
    if not bars:
        parts.append('<text x="4" y="44" class="l">(none)</text>')
    for i, (label, value) in enumerate(bars):
        y = 28 + i * row_h
        w = inner * value / top
        colour = COLOURS[i % len(COLOURS)]
        parts.append(
            f'<text x="{label_w - 6}" y="{y + 14}" class="l" text-anchor="end">{_esc(label)}</text>'
        )
        parts.append(
            f'<rect x="{label_w}" y="{y + 2}" width="{w:.1f}" height="16" fill="{colour}"/>'
        )
        end = label_w + w + 4
        parts.append(f'<text x="{end:.1f}" y="{y + 14}" class="l">{_fmt(value)}{_esc(unit)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def html_table(rows: Table, columns: Sequence[str]) -> str:
    head = "".join(f"<th>{_esc(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{_esc(_fmt(row.get(c)))}</td>" for c in columns) + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;color:#111;max-width:900px}
h1{font-size:1.5em}h2{font-size:1.15em;margin-top:2em}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0}
td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}th{background:#f3f4f6}
td:first-child,th:first-child{text-align:left}
svg .t{font-size:14px;font-weight:600}svg .l{font-size:11px}svg .a{stroke:#888}
"""

KINDS = ("published", "delivered", "acked", "dead_lettered", "expired", "dropped")


def _deliveries(count: Any) -> str:
    return "1 delivery" if count == 1 else f"{count} deliveries"


def render(data: ReportData) -> str:
    """The whole report as one HTML document."""
    minutes = [_fmt(r.get("minute")) for r in data.per_minute]
    series = {k: [_num(r.get(k)) for r in data.per_minute] for k in KINDS[:5]}
    sections = [
        f"<h1>{_esc(data.title)}</h1>",
        f"<p>Journal: <code>{_esc(data.source)}</code> · generated {_esc(data.generated_at)}</p>",
        "<h2>Per queue</h2>",
        html_table(data.queue_totals, ("queue", *KINDS)),
        "<h2>Per minute (all queues)</h2>",
        line_chart("messages per minute", minutes, series),
        "<h2>Publish → ack latency</h2>",
        bar_chart(
            "p50 / p95 / p99 latency per queue (ms; * = all queues)",
            [
                (f"{r.get('queue')} {p}", _num(r.get(f"{p}_ms")))
                for r in data.latency
                for p in ("p50", "p95", "p99")
            ],
            " ms",
        ),
        html_table(
            data.latency, ("queue", "messages", "p50_ms", "p95_ms", "p99_ms", "mean_ms", "max_ms")
        ),
        "<h2>Redeliveries</h2>",
        bar_chart(
            "messages by number of deliveries",
            [
                (_deliveries(r.get("deliveries")), _num(r.get("messages")))
                for r in data.redeliveries
            ],
        ),
        "<h2>Dead letters</h2>",
        bar_chart(
            "dead-lettered messages by queue and reason",
            [
                (f"{r.get('queue')}: {r.get('reason')}", _num(r.get("messages")))
                for r in data.dead_letters
            ],
        ),
        "<h2>Payload sizes</h2>",
        bar_chart(
            "messages by payload size (bytes, up to)",
            [
                (f"≤ {_fmt(r.get('size_bucket'))} B", _num(r.get("messages")))
                for r in data.payload_sizes
            ],
        ),
    ]
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{_esc(data.title)}</title><style>{_STYLE}</style></head><body>"
        + "\n".join(sections)
        + "</body></html>\n"
    )
