"""Which build is running: pure Python, or the hot modules compiled with mypyc.

``HOT_MODULES`` is the one list of what the optional compiled build compiles (setup.py and
scripts/compile.py read it); ``describe()`` is what ``vibemq-server --version`` and the start
log line say. A module counts as compiled when it was loaded from an extension, not a .py file.
"""

from __future__ import annotations

import importlib
from pathlib import Path

#: the modules on the native 1 -> 1 path that pay for compiling (docs/performance.md)
HOT_MODULES = (
    "vibemq_server.protocol.codec",
    # input held over reads (every protocol's decoders): a cut frame's parts, its head (issue
    # 16: at 64 KiB a quarter of MQTT's PUBLISHes are cut; interpreted, each call was generic)
    "vibemq_server.protocol.held",
    "vibemq_server.server.session",
    "vibemq_server.core.queue",
    "vibemq_server.core.manager",
    # the address sinks of every native publish (the broker registers MQTT's and AMQP's):
    # interpreted, ``ready(msg)`` was a Python frame a publish (~1,800 instructions)
    "vibemq_server.core.routing",
    # the connection's permissions: every native publish reads ``access.everything``
    # (interpreted, a lookup by name from the compiled session, ~160 instructions)
    "vibemq_server.core.permissions",
    # the stored message: its ints (sequence, timestamps) unboxed, 60 bytes less per message
    "vibemq_server.core.message",
    # the shared transport: every protocol's reads and writes (the native path's the most)
    "vibemq_server.server.transport",
    # once a read and once a write of every connection: the stall clock (an incomplete
    # frame's) and the joining of a write's small pieces (issue 16: at 64 KiB each was a
    # generic call into interpreted code from the compiled sessions and transport)
    "vibemq_server.server.stall",
    "vibemq_server.core.buffers",
    # the broker's clock (read once a publish) and the protocols' counters (two adds a
    # message): interpreted, each cost a compiled caller a generic call or attribute access
    "vibemq_server.core.clock",
    "vibemq_server.server.stats",
    # the durable path: the journal's per-message calls and the records they build (each
    # alone did not pay: the interpreted journal called the compiled records generically)
    "vibemq_server.journal.journal",
    "vibemq_server.journal.records",
    # a durable publish's PublishAck waiting for the fsync (once a publish, from the session)
    "vibemq_server.core.durable_replies",
    # the persistence's base class: the core's calls into the journal go through its vtable
    # (interpreted, the journal's base would be a Python class and every call generic again)
    "vibemq_server.core.persistence",
    # the MQTT adapter (3.1.1 and 5.0): codecs, packets, per-client state and the connections'
    # handlers are all per-message work (issues 16 and 18: 64 KiB, v5, WebSockets)
    "vibemq_server.adapters.mqtt.packets",
    "vibemq_server.adapters.mqtt.packets5",
    "vibemq_server.adapters.mqtt.codec",
    "vibemq_server.adapters.mqtt.codec5",
    "vibemq_server.adapters.mqtt.topics",
    "vibemq_server.adapters.mqtt.states",
    "vibemq_server.adapters.mqtt.message5",
    "vibemq_server.adapters.mqtt.session",
    "vibemq_server.adapters.mqtt.session5",
    "vibemq_server.adapters.mqtt.connection",
    "vibemq_server.adapters.mqtt.connection5",
    "vibemq_server.server.websocket",
    # the MQTT routing: route, deliver, the shared groups' round robin (issue 18: a shared
    # group of 4 spent about 30 % of the broker in it, interpreted)
    "vibemq_server.adapters.mqtt.server",
    # the AMQP adapter (issues 15 and 16): the codec, the connection's frame dispatch and
    # per-message handlers, the channels' deliveries and acks, the mapper and the routing
    "vibemq_server.adapters.amqp.codec",
    "vibemq_server.adapters.amqp.states",
    "vibemq_server.adapters.amqp.base",
    "vibemq_server.adapters.amqp.handshake",
    "vibemq_server.adapters.amqp.declarations",
    "vibemq_server.adapters.amqp.connection",
    "vibemq_server.adapters.amqp.basic",
    "vibemq_server.adapters.amqp.channel",
    "vibemq_server.adapters.amqp.mapping",
    "vibemq_server.adapters.amqp.server",
)


_GRACE_S = 60.0


def compiled_modules() -> list[str]:
    """The hot modules loaded from compiled extensions."""
    out = []
    for name in HOT_MODULES:
        path = getattr(importlib.import_module(name), "__file__", None) or ""
        if not path.endswith(".py"):
            out.append(name)
    return out


def stale_modules() -> list[str]:
    """Compiled hot modules whose .py beside them changed after they were built (an in-place
    build in a checkout, scripts/compile.py): the extension shadows the edited source. (A
    minute's grace: an installer writes a wheel's .py files just after its extensions.)"""
    out = []
    # (Not from the module's __file__: mypyc derives it from the shared library's place, which
    # is inside the package, so it names a path that does not exist.)
    top = Path(__file__).resolve().parent.parent
    # The code of every module is in the group's shared library; a module's own small
    # extension only loads it, and a rebuild leaves it as it was when it did not change.
    group = [p for p in top.glob("vibemq_server/_hot__mypyc*") if p.suffix in (".so", ".pyd")]
    for name in compiled_modules():
        src = top / (name.replace(".", "/") + ".py")
        exts = [p for p in src.parent.glob(src.stem + ".*") if p.suffix in (".so", ".pyd")]
        built = max((p.stat().st_mtime for p in exts + group), default=None)
        if built is not None and src.is_file() and src.stat().st_mtime > built + _GRACE_S:
            out.append(name)
    return out


def describe() -> str:
    """``compiled: mypyc, 23/23 hot modules`` or ``pure Python``."""
    done = len(compiled_modules())
    if not done:
        return "pure Python"
    return f"compiled: mypyc, {done}/{len(HOT_MODULES)} hot modules"
