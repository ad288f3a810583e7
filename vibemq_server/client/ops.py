"""The ``vibemq`` CLI's operator commands, over the broker's management HTTP API
(docs/management.md): ``connections``, ``close``, ``purge``, ``browse``, ``dlq-requeue``,
``export``, ``import``, ``stats``.

Where: ``--http-url`` (``$VIBEMQ_HTTP_URL``, default http://127.0.0.1:2927; https with
``--cafile``). Who: ``--user`` (``$VIBEMQ_USER``) with the password from ``$VIBEMQ_PASSWORD``
or a prompt -- never from the command line, where any local user could read it (``ps``) --
or ``--token``/``$VIBEMQ_TOKEN`` as a bearer token. Output: tables for people, ``--json``
for programs. Exit codes: 0 done, 1 refused by the broker or unreachable (the reason on
stderr), 2 bad usage.
"""

from __future__ import annotations

import argparse
import datetime as dt
import getpass
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from vibemq_server.client.api import DEFAULT_HTTP_URL, ApiClient, ApiError, quote
from vibemq_server.client.connection import tls_context

Command = Callable[[ApiClient, argparse.Namespace], int]


def add_http_options(parser: argparse.ArgumentParser) -> None:
    env = os.environ
    parser.add_argument(
        "--http-url",
        default=env.get("VIBEMQ_HTTP_URL") or DEFAULT_HTTP_URL,
        help=f"management API, for the operator commands (default: $VIBEMQ_HTTP_URL or "
        f"{DEFAULT_HTTP_URL})",
    )
    parser.add_argument(
        "--user",
        default=env.get("VIBEMQ_USER") or None,
        help="API user (default: $VIBEMQ_USER); its password comes from $VIBEMQ_PASSWORD "
        "or a prompt",
    )


def positive_int(text: str) -> int:
    """argparse type: an integer of at least 1 (for the commands here and in cli.py)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def add_commands(sub: Any) -> None:
    """The operator commands, on the CLI's subparsers."""

    def command(name: str, help: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(name, help=help)
        p.add_argument("--json", action="store_true", help="print JSON (for programs)")
        return p

    p = command("connections", "list client connections (HTTP API)")
    p.add_argument("--protocol", choices=("vibemq", "mqtt", "amqp"), help="only this protocol")
    p = command("close", "close a client connection; its client is told the reason (HTTP API)")
    p.add_argument("id", metavar="ID", help="connection id (see `vibemq connections`)")
    p.add_argument("--reason", help="what the client is told")
    p = command("purge", "drop every ready message of a queue (HTTP API)")
    p.add_argument("queue", metavar="QUEUE")
    p = command("browse", "show a queue's ready messages without consuming them (HTTP API)")
    p.add_argument("queue", metavar="QUEUE")
    p.add_argument("--count", "-n", type=positive_int, default=10, help="at most N (default 10)")
    p.add_argument("--offset", type=int, default=0, help="skip the first N")
    p = command(
        "dlq-requeue",
        "send a dead-letter queue's messages back to their original queues (HTTP API)",
    )
    p.add_argument("queue", metavar="QUEUE", help="the dead-letter queue, e.g. orders.dlq")
    p.add_argument("--target", help="move them all to this queue instead")
    p.add_argument("--limit", type=positive_int, help="at most N messages")
    p = sub.add_parser("export", help="export definitions as JSON (HTTP API)")
    p.add_argument("file", metavar="FILE", nargs="?", help="write here (mode 0600); default stdout")
    p = command("import", "import definitions from a JSON file, '-' for stdin (HTTP API)")
    p.add_argument("file", metavar="FILE")
    command("stats", "the broker at a glance: connections, queues, rates, memory (HTTP API)")


# -- output ------------------------------------------------------------------------------------


def _emit_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")


def table(headers: Sequence[str] | None, rows: Sequence[Sequence[object]]) -> str:
    """Columns padded to their widest cell, numbers right-aligned; a header line if given."""
    width_of = len(headers) if headers is not None else len(rows[0]) if rows else 0
    cells = [["" if c is None else str(c) for c in r] for r in rows]
    if headers is not None:
        cells.insert(0, [str(h) for h in headers])
    widths = [max(len(row[i]) for row in cells) for i in range(width_of)]
    numeric = [
        bool(rows) and all(isinstance(r[i], int | float) for r in rows) for i in range(width_of)
    ]
    lines = []
    for row in cells:
        parts = [
            cell.rjust(width) if numeric[i] else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _since(iso: str) -> str:
    """An ISO time as a short age ("3m12s")."""
    try:
        then = dt.datetime.fromisoformat(iso.replace("Z", "+00:00"))
    except ValueError:
        return iso
    seconds = int((dt.datetime.now(dt.UTC) - then).total_seconds())
    return _duration(max(seconds, 0))


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h"
    if hours:
        return f"{hours}h{minutes}m"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


# -- the commands --------------------------------------------------------------------------------


def _connections(api: ApiClient, args: argparse.Namespace) -> int:
    found = api.request("GET", "/api/connections", query={"protocol": args.protocol})
    if args.json:
        _emit_json(found)
        return 0
    if not found:
        print("no connections", file=sys.stderr)
        return 0
    rows = [
        [
            c["id"],
            c["protocol"],
            c.get("user") or "-",
            c.get("client_id") or "-",
            f"{c['peer_host']}:{c['peer_port']}",
            "tls" if c.get("tls") else "",
            _since(str(c["connected_at"])),
            c.get("consumers", 0),
            _size(c.get("bytes_in", 0)),
            _size(c.get("bytes_out", 0)),
        ]
        for c in found
    ]
    headers = ["ID", "PROTOCOL", "USER", "CLIENT", "PEER", "TLS", "AGE", "CONSUMERS", "IN", "OUT"]
    print(table(headers, rows))
    return 0


def _close(api: ApiClient, args: argparse.Namespace) -> int:
    closed = api.request(
        "DELETE", f"/api/connections/{quote(args.id)}", query={"reason": args.reason}
    )
    if args.json:
        _emit_json(closed)
    else:
        who = closed.get("user") or "anonymous"
        print(f"closed {closed['id']} ({closed['protocol']}, {who})")
    return 0


def _purge(api: ApiClient, args: argparse.Namespace) -> int:
    purged = api.request("DELETE", f"/api/queues/{quote(args.queue)}/contents")
    if args.json:
        _emit_json(purged)
    else:
        print(f"purged {purged['purged']} messages from {args.queue}")
    return 0


def _browse(api: ApiClient, args: argparse.Namespace) -> int:
    page = api.request(
        "GET",
        f"/api/queues/{quote(args.queue)}/messages",
        query={"offset": args.offset, "limit": args.count},
    )
    if args.json:
        _emit_json(page)
        return 0
    print(f"{args.queue}: {page['count']} of {page['messageCount']} ready messages")
    for msg in page["messages"]:
        print()
        attempts = msg.get("deliveryAttempts", 0)
        print(f"id {msg['id']}  published {msg['publishedAt']}  priority {msg['priority']}")
        print(f"  {msg['size']} bytes ({msg['payloadEncoding']}), delivery attempts {attempts}")
        for key, value in sorted(msg.get("headers", {}).items()):
            print(f"  {key}: {value}")
        payload = msg["payload"]
        text = (
            json.dumps(payload, indent=2, ensure_ascii=False)
            if msg["payloadEncoding"] == "json"
            else str(payload)
        )
        print("  " + text.replace("\n", "\n  "))
    return 0


def _dlq_requeue(api: ApiClient, args: argparse.Namespace) -> int:
    body: dict[str, Any] = {}
    if args.target:
        body["target"] = args.target
    if args.limit:
        body["limit"] = args.limit
    moved = api.request("POST", f"/api/queues/{quote(args.queue)}/move", body=body)
    if args.json:
        _emit_json(moved)
        return 0
    where = ", ".join(f"{n} to {q}" for q, n in sorted(moved["moved"].items())) or "none"
    print(f"moved {moved['total']} messages from {args.queue} ({where}); kept {moved['kept']}")
    return 0


def _export(api: ApiClient, args: argparse.Namespace) -> int:
    doc = api.request("GET", "/api/definitions")
    text = json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
    if args.file in (None, "-"):
        sys.stdout.write(text)
        return 0
    # The document holds the users' password hashes: readable by its owner only.
    path = Path(args.file)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    counts = ", ".join(f"{len(doc.get(k, []))} {k}" for k in ("queues", "exchanges", "users"))
    print(f"exported {counts} to {path}", file=sys.stderr)
    return 0


def _import(api: ApiClient, args: argparse.Namespace) -> int:
    raw = sys.stdin.read() if args.file == "-" else Path(args.file).read_text(encoding="utf-8")
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise ApiError(0, f"{args.file}: not JSON ({exc})") from None
    report = api.request("POST", "/api/definitions", body=doc)
    if args.json:
        _emit_json(report)
    else:
        for kind in ("users", "queues", "exchanges", "bindings"):
            made = report["created"].get(kind, [])
            same = report["unchanged"].get(kind, [])
            print(f"{kind}: {len(made)} created, {len(same)} unchanged")
        for conflict in report["conflicts"]:
            print(f"conflict: {conflict['kind']} {conflict['name']}: {conflict['reason']}")
    # Conflicts were left as they are on the broker: a script should notice.
    return 1 if report["conflicts"] else 0


def _stats(api: ApiClient, args: argparse.Namespace) -> int:
    o = api.request("GET", "/api/overview")
    if args.json:
        _emit_json(o)
        return 0
    by_protocol = ", ".join(f"{p} {n}" for p, n in sorted(o["connections"]["byProtocol"].items()))
    rates = o["rates"]["current"]
    memory = o["memory"]
    journal = o["journal"]
    rows = [
        ["version", o["version"]],
        ["phase", o["phase"]],
        ["uptime", _duration(o["uptimeSeconds"])],
        ["connections", f"{o['connections']['total']}" + (f" ({by_protocol})" * bool(by_protocol))],
        [
            "queues",
            f"{o['queues']['count']} ({o['queues']['ready']} ready, "
            f"{o['queues']['unacked']} unacked)",
        ],
        [
            "rates /s",
            ", ".join(f"{k} {v:g}" for k, v in rates.items() if isinstance(v, int | float)),
        ],
        [
            "memory",
            f"rss {_size(memory['rssBytes'])}, ready messages {_size(memory['readyBytes'])}"
            + (", publishers blocked" if memory.get("publishersBlocked") else ""),
        ],
        [
            "journal",
            f"{journal['segments']} segments, {_size(journal['bytes'])}, fsync {journal['fsync']}",
        ],
    ]
    print(table(None, rows))
    return 0


COMMANDS: dict[str, Command] = {
    "connections": _connections,
    "close": _close,
    "purge": _purge,
    "browse": _browse,
    "dlq-requeue": _dlq_requeue,
    "export": _export,
    "import": _import,
    "stats": _stats,
}


def _password(user: str) -> str:
    password = os.environ.get("VIBEMQ_PASSWORD")
    if password is not None:
        return password
    return getpass.getpass(f"Password for {user}: ")


def api_client(args: argparse.Namespace) -> ApiClient:
    url: str = args.http_url
    ssl_context = None
    if url.startswith("https:"):
        ssl_context = tls_context(args.cafile, args.cert, args.key)
    return ApiClient(
        url,
        user=args.user,
        password=_password(args.user) if args.user else None,
        token=None if args.user else args.token,
        ssl_context=ssl_context,
        timeout=args.timeout,
    )


def run(args: argparse.Namespace, prog: str) -> int:
    """Run an operator command; errors as one line on stderr, exit code 1."""
    try:
        return COMMANDS[args.command](api_client(args), args)
    except ApiError as exc:
        print(f"{prog}: error: {exc.message}", file=sys.stderr)
        return 1
    except OSError as exc:  # an unreadable FILE or --cafile
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
