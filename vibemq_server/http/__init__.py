"""The management HTTP listener: REST API under /api/ (OpenAPI), health probes, and the
mount points of /metrics and other management areas (docs/management.md).

One listener on the broker's own event loop: FastAPI (the API described by OpenAPI from
pydantic models) served by uvicorn's httptools protocol on sockets the broker opens itself
(listener.py says why not ``uvicorn.Server``). The broker never imports this package: the
composition root (``vibemq_server.app``) builds ``HttpListener`` from its import string.
"""
