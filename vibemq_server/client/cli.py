"""The ``vibemq`` command-line client: publish, subscribe and manage queues from a shell
(the native protocol), and the operator's daily commands over the management HTTP API
(``ops.py``: connections, close, purge, browse, dlq-requeue, export, import, stats).

Connection settings come from ``--host``/``--port``/``--token``, falling back to the
``VIBEMQ_HOST``/``VIBEMQ_PORT``/``VIBEMQ_TOKEN`` environment variables. Output meant for
programs (messages, queue info) goes to stdout as JSON; diagnostics go to stderr. Exit codes:
0 success, 1 error reported by the server or the connection, 2 bad usage, 130 interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from vibemq_server.client import ops
from vibemq_server.client.connection import DEFAULT_PORT, Client, tls_context
from vibemq_server.client.errors import VibeMQError

PROG = "vibemq"
DELIVERY_MODES = ("RoundRobin", "FanOutWithAck", "FanOutWithoutAck", "PriorityBased")
OVERFLOW_STRATEGIES = ("DropOldest", "DropNewest", "BlockPublisher", "RedirectToDlq")
PRIORITIES = ("Low", "Normal", "High", "Critical")
_PUBLISH_WINDOW = 256  # publishes in flight at once with --count


def _header(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def parse_payload(text: str) -> Any:
    """PAYLOAD is JSON when it parses as JSON, otherwise it is sent as a JSON string."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def build_parser() -> argparse.ArgumentParser:
    env = os.environ
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Command-line client for a VibeMQ broker.",
        epilog="Environment: VIBEMQ_HOST, VIBEMQ_PORT, VIBEMQ_TOKEN supply defaults; the "
        "operator commands (connections, close, purge, browse, dlq-requeue, export, import, "
        "stats) use the management HTTP API: VIBEMQ_HTTP_URL, VIBEMQ_USER with "
        "VIBEMQ_PASSWORD, or VIBEMQ_TOKEN as a bearer token.",
    )
    parser.add_argument(
        "--host",
        default=env.get("VIBEMQ_HOST", "127.0.0.1"),
        help="broker host (default: $VIBEMQ_HOST or 127.0.0.1)",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=None,
        help=f"broker port (default: $VIBEMQ_PORT or {DEFAULT_PORT})",
    )
    parser.add_argument(
        "--token",
        default=env.get("VIBEMQ_TOKEN") or None,
        help="authentication token, also the HTTP API's bearer token (default: $VIBEMQ_TOKEN)",
    )
    ops.add_http_options(parser)
    parser.add_argument(
        "--tls", action="store_true", help="connect over TLS (implied by --cafile/--cert)"
    )
    parser.add_argument("--cafile", help="CA certificates (PEM) to verify the broker with")
    parser.add_argument("--cert", help="client certificate (PEM), for mutual TLS")
    parser.add_argument("--key", help="its private key (default: in --cert)")
    parser.add_argument(
        "--timeout", type=float, default=10.0, help="seconds to wait for each reply (default 10)"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("publish", help="publish a message")
    p.add_argument("queue", metavar="QUEUE")
    p.add_argument("payload", metavar="PAYLOAD", help="JSON value (non-JSON is sent as a string)")
    p.add_argument(
        "--header",
        "-H",
        action="append",
        type=_header,
        default=[],
        metavar="KEY=VALUE",
        help="message header (repeatable)",
    )
    p.add_argument("--priority", choices=PRIORITIES, help="message priority")
    p.add_argument("--count", "-n", type=ops.positive_int, default=1, help="publish N copies")
    p.add_argument("--quiet", "-q", action="store_true", help="do not print message ids")

    s = sub.add_parser("subscribe", help="print messages as JSON lines as they arrive")
    s.add_argument("queue", metavar="QUEUE")
    s.add_argument("--count", "-n", type=ops.positive_int, help="stop after N messages")
    s.add_argument("--no-ack", action="store_true", help="do not acknowledge messages")
    s.add_argument("--prefetch", type=ops.positive_int, help="max unacknowledged deliveries")

    lq = sub.add_parser("list-queues", help="list queue names, one per line")
    lq.add_argument("--json", action="store_true", help="print a JSON array instead")

    qi = sub.add_parser("queue-info", help="print a queue's statistics as JSON")
    qi.add_argument("queue", metavar="QUEUE")

    c = sub.add_parser("create-queue", help="create a queue")
    c.add_argument("queue", metavar="QUEUE")
    c.add_argument("--mode", choices=DELIVERY_MODES, default="RoundRobin", help="delivery mode")
    c.add_argument("--max-size", type=ops.positive_int, help="maximum number of messages")
    c.add_argument("--ttl-ms", type=ops.positive_int, help="message time-to-live in milliseconds")
    c.add_argument("--dlq", action="store_true", help="enable the dead-letter queue")
    c.add_argument("--dlq-name", help="dead-letter queue name")
    c.add_argument("--overflow", choices=OVERFLOW_STRATEGIES, help="what to do when full")
    c.add_argument("--max-retries", type=ops.positive_int, help="delivery attempts before DLQ")
    c.add_argument("--ack-timeout-ms", type=ops.positive_int, help="redeliver after this long")

    d = sub.add_parser("delete-queue", help="delete a queue")
    d.add_argument("queue", metavar="QUEUE")

    sub.add_parser("ping", help="measure the round-trip time to the broker")
    ops.add_commands(sub)
    return parser


def _emit(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, ensure_ascii=False) + "\n")
    sys.stdout.flush()  # line by line, so pipes see each message as it arrives


async def _publish(client: Client, args: argparse.Namespace) -> int:
    payload = parse_payload(args.payload)
    headers = dict(args.header)
    window = asyncio.Semaphore(_PUBLISH_WINDOW)

    async def one() -> str:
        async with window:
            return await client.publish(
                args.queue, payload, headers=headers, priority=args.priority
            )

    # Tasks start in creation order and write without awaiting, so messages keep their order.
    tasks = [asyncio.create_task(one()) for _ in range(args.count)]
    try:
        for task in tasks:
            msg_id = await task
            if not args.quiet:
                print(msg_id, flush=True)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return 0


async def _subscribe(client: Client, args: argparse.Namespace) -> int:
    received = 0
    sub = await client.subscribe(args.queue, prefetch=args.prefetch)
    async with sub:
        async for msg in sub:
            _emit(msg.to_dict())
            if not args.no_ack:
                await msg.ack()
            received += 1
            if args.count is not None and received >= args.count:
                return 0
    if sub.end_reason == "queue_deleted":
        print(f"{PROG}: queue {args.queue!r} was deleted", file=sys.stderr)
    return 0


async def _run(args: argparse.Namespace) -> int:
    port = args.port if args.port is not None else int(os.environ.get("VIBEMQ_PORT", DEFAULT_PORT))
    # One-shot commands should fail fast rather than retry in the background.
    ssl_context = None
    if args.tls or args.cafile or args.cert:
        ssl_context = tls_context(args.cafile, args.cert, args.key)
    async with await Client.connect(
        args.host,
        port,
        token=args.token,
        reconnect=False,
        request_timeout=args.timeout,
        ssl_context=ssl_context,
    ) as client:
        cmd = args.command
        if cmd == "publish":
            return await _publish(client, args)
        if cmd == "subscribe":
            return await _subscribe(client, args)
        if cmd == "list-queues":
            names = await client.list_queues()
            if args.json:
                _emit(names)
            else:
                for name in names:
                    print(name)
            return 0
        if cmd == "queue-info":
            print(json.dumps(await client.queue_info(args.queue), indent=2, ensure_ascii=False))
            return 0
        if cmd == "create-queue":
            await client.create_queue(
                args.queue,
                args.mode,
                max_queue_size=args.max_size,
                message_ttl_ms=args.ttl_ms,
                enable_dead_letter_queue=True if args.dlq else None,
                dead_letter_queue_name=args.dlq_name,
                overflow_strategy=args.overflow,
                max_retry_attempts=args.max_retries,
                ack_timeout_ms=args.ack_timeout_ms,
            )
            print(f"created queue {args.queue}", file=sys.stderr)
            return 0
        if cmd == "delete-queue":
            await client.delete_queue(args.queue)
            print(f"deleted queue {args.queue}", file=sys.stderr)
            return 0
        if cmd == "ping":
            rtt = await client.ping()
            print(f"pong from {args.host}:{port} in {rtt * 1000:.2f} ms")
            return 0
        raise AssertionError(f"unhandled command {cmd}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.port is None and "VIBEMQ_PORT" in os.environ:
        try:
            int(os.environ["VIBEMQ_PORT"])
        except ValueError:
            parser.error(f"VIBEMQ_PORT is not a number: {os.environ['VIBEMQ_PORT']!r}")
    if args.command in ops.COMMANDS:  # over the management HTTP API, not the protocol
        try:
            return ops.run(args, PROG)
        except KeyboardInterrupt:
            return 130
    try:
        return asyncio.run(_run(args))
    except VibeMQError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader of our stdout went away (e.g. `| head`): not an error worth a traceback.
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the flush at exit
        return 0
    except OSError as exc:  # an unreadable --cafile/--cert/--key
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
