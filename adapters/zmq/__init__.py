"""ZeroMQ bridge (docs/zmq.md).

* :mod:`adapters.zmq.mme` -- the RFC 50/MME codec (it lives in
  :mod:`vibemq_server.protocol.mme`, free of pyzmq, so the client library can use it).
* :mod:`adapters.zmq.bridge` -- :class:`ZmqBridge`: a PULL socket publishing into the core,
  a PUB socket sending what the core's observers see. Imports pyzmq; nothing else here does.
"""
