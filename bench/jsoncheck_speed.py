"""Issue 16: the native protocol's payload check, MB/s per validator and size, alternating rounds.

    PYTHONPATH=. .venv/bin/python -m bench.jsoncheck_speed [--rounds 5] [--simdjson DIR]

Validators: orjson.loads (the check before), the compiled checker (``_jsoncheck.c``), the same
fed in 256,000-byte parts (``Checker``: a payload checked read by read), the pure
fallback (``jsoncheck.valid_slow``), and pysimdjson's ``Parser.parse`` when it is importable
(``--simdjson``: a ``pip install --target`` directory put on sys.path). Documents: 1 KB, 1 MB
and 64 MB of records (objects of strings and numbers), and 64 MB of one JSON string of hex
digits (the big-message tests' payload). A last line
says whether the compiled check lets another thread run meanwhile (it releases the GIL).
"""

from __future__ import annotations

import argparse
import importlib
import json
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable

import orjson

from vibemq_server.protocol import jsoncheck

SIZES = {"1 KB": 1_000, "1 MB": 1_000_000, "64 MB": 64_000_000}
#: the big-message tests' and bigmsg_pingpong's payload: one JSON string of hex digits
STRING_LABEL = "64 MB string"


def document(size: int) -> bytes:
    """A JSON array of records (text, numbers, nesting) of about ``size`` bytes."""
    record = {
        "id": 123456,
        "name": "sensor-0042 \u00e9t\u00e9",
        "values": [1.5, -2.25e3, 0, 17],
        "ok": True,
        "note": "lorem ipsum dolor sit amet " * 2,
    }
    one = json.dumps(record, ensure_ascii=False).encode()
    count = max(1, size // (len(one) + 1))
    return b"[" + b",".join([one] * count) + b"]"


def validators(simdjson_dir: str | None) -> dict[str, Callable[[bytes], object]]:
    out: dict[str, Callable[[bytes], object]] = {"orjson.loads": orjson.loads}
    if jsoncheck.COMPILED:
        from vibemq_server.protocol._jsoncheck import valid

        out["_jsoncheck (C)"] = valid
        out["Checker, 256,000-B parts"] = in_parts
    out["valid_slow (pure fallback)"] = jsoncheck.valid_slow
    if simdjson_dir:
        sys.path.insert(0, simdjson_dir)
    try:
        simdjson = importlib.import_module("simdjson")  # (not a dependency: no types)
        parser = simdjson.Parser()
        out["pysimdjson Parser.parse"] = parser.parse
    except ImportError:
        pass
    return out


#: the transport's read size: what a payload filled in place is checked in
PART = 256_000


def in_parts(doc: bytes) -> bool:
    """The compiled check fed ``doc`` a read at a time (``jsoncheck.checker``), as a native
    payload filled in place is checked as its reads land."""
    check = jsoncheck.checker()
    for start in range(0, len(doc), PART):
        check.feed(doc, start, min(len(doc), start + PART))
    return check.finish()


def rate(check: Callable[[bytes], object], doc: bytes, budget: float) -> float:
    """MB/s over as many calls as fit ``budget`` seconds (at least one)."""
    n, start = 0, time.perf_counter()
    while True:
        check(doc)
        n += 1
        spent = time.perf_counter() - start
        if spent >= budget:
            return n * len(doc) / spent / 1e6


def gil_released(doc: bytes) -> str:
    """Counts a Python thread's loop turns while the compiled check runs on a 64 MB document."""
    if not jsoncheck.COMPILED:
        return "not built"
    from vibemq_server.protocol._jsoncheck import valid

    turns = 0
    stop = threading.Event()

    def spin() -> None:
        nonlocal turns
        while not stop.is_set():
            turns += 1

    sys.setswitchinterval(0.001)
    t = threading.Thread(target=spin)
    t.start()
    time.sleep(0.01)
    before = turns
    valid(doc)
    during = turns - before
    stop.set()
    t.join()
    return f"another thread ran {during:,} loop turns during one 64 MB check"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--simdjson", help="a directory holding pysimdjson (pip install --target)")
    args = ap.parse_args()
    checks = validators(args.simdjson)
    docs = {label: document(size) for label, size in SIZES.items()}
    docs[STRING_LABEL] = b'"' + random.Random(1).randbytes(32_000_000).hex().encode() + b'"'
    results: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.rounds):
        for label, doc in docs.items():
            budget = 0.3 if len(doc) < 10_000_000 else 1.0
            for name, check in checks.items():  # alternating within each round
                results.setdefault((name, label), []).append(rate(check, doc, budget))
    print(f"{'validator':<28}" + "".join(f"{label:>14}" for label in docs))
    for name in checks:
        cells = "".join(
            f"{statistics.median(results[(name, label)]):>9,.0f} MB/s"[-14:].rjust(14)
            for label in docs
        )
        print(f"{name:<28}{cells}")
    print(gil_released(docs["64 MB"]))
    if jsoncheck.COMPILED:
        from vibemq_server.protocol._jsoncheck import SIMD

        print(f"the compiled checker's plain-run step: {SIMD}")


if __name__ == "__main__":
    main()
