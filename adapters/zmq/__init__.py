"""ZeroMQ bridge (docs/zmq.md).

* :mod:`vibemq_server.adapters.zmq.mme` -- the RFC 50/MME codec (it lives in
  :mod:`vibemq_server.protocol.mme`, free of pyzmq, so the client library can use it).
* :mod:`vibemq_server.adapters.zmq.bridge` -- :class:`ZmqBridge`: a PULL socket publishing
  into the core, a PUB socket sending what the core routes to it. Imports pyzmq; nothing
  else here does.
"""
