"""The journal's fsync threads (vibemq_server/journal/fsyncer.py, issue 15): the C ones
(``_fsyncer.c``, no GIL) complete what the Python ones complete, with the same errors, wake
the loop through their eventfd, and finish what was requested before they close."""

from __future__ import annotations

import os
import select
import tempfile
import time
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vibemq_server.journal import fsyncer
from vibemq_server.journal.fsyncer import Completion, Fsyncs, PyFsyncs

# what an fd given to fsync can be: a file, a pipe (EINVAL), none open (EBADF)
KINDS = ("file", "pipe", "closed")


@pytest.fixture(scope="module")
def fds() -> Iterator[dict[str, int]]:
    with tempfile.TemporaryFile() as f:
        f.write(b"x" * 100)
        f.flush()
        r, w = os.pipe()
        try:
            # (not a closed fd's number: the next eventfd would take it)
            yield {"file": f.fileno(), "pipe": w, "closed": 999_999}
        finally:
            os.close(r)
            os.close(w)


def _compiled(threads: int) -> Fsyncs:
    assert fsyncer.Compiled is not None, "build it: pip install -e . or scripts/build_ext.sh"
    return fsyncer.Compiled(threads)


def _gather(fs: Fsyncs, count: int) -> list[Completion]:
    """Wait on the eventfd, as the loop does, until ``count`` fsyncs have completed."""
    out: list[Completion] = []
    deadline = time.monotonic() + 10
    while len(out) < count:
        assert time.monotonic() < deadline, f"{len(out)} of {count} fsyncs completed"
        readable, _, _ = select.select([fs.fileno()], [], [], 1.0)
        if readable:
            out.extend(fs.completed())
    return out


def _outcomes(done: list[Completion]) -> dict[int, tuple[type[Exception], int] | None]:
    out: dict[int, tuple[type[Exception], int] | None] = {}
    for number, seconds, err in done:
        assert number not in out, "one completion per request"
        assert seconds >= 0
        out[number] = None if err is None else (type(err), getattr(err, "errno", 0))
    return out


def test_the_compiled_fsyncer_is_built() -> None:
    assert fsyncer.Compiled is not None, "build it: pip install -e . or scripts/build_ext.sh"


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 3), st.lists(st.sampled_from(KINDS), min_size=1, max_size=12))
def test_compiled_and_pure_complete_the_same(
    fds: dict[str, int], threads: int, kinds: list[str]
) -> None:
    results = []
    for fs in (_compiled(threads), PyFsyncs(os.fsync, threads)):
        try:
            for number, kind in enumerate(kinds, 1):
                fs.request(fds[kind], number)
            results.append(_outcomes(_gather(fs, len(kinds))))
            assert fs.completed() == []  # each completion is handed over once
        finally:
            fs.close()
    assert results[0] == results[1]
    assert set(results[0]) == set(range(1, len(kinds) + 1))
    for number, kind in enumerate(kinds, 1):
        assert (results[0][number] is None) is (kind == "file")


@pytest.mark.parametrize("impl", ["compiled", "pure"])
def test_close_finishes_what_was_requested(fds: dict[str, int], impl: str) -> None:
    fs = _compiled(2) if impl == "compiled" else PyFsyncs(os.fsync, 2)
    for number in range(1, 21):
        fs.request(fds["file"], number)
    fs.close()
    assert _outcomes(fs.completed()) == dict.fromkeys(range(1, 21))
    fs.close()  # twice is harmless
    with pytest.raises(ValueError, match="closed"):
        fs.request(fds["file"], 21)
