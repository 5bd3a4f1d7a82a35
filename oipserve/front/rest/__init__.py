"""The OIP REST surface, one job per module, read in the order a request flows.

- ``app``: the ASGI app (Falcon's, with the size limit checked before the body
  is read) and its routes.
- ``body``: receiving a request body: into a pooled shared-memory segment for
  binary and large requests, into bytes otherwise.
- ``coding``: ``Content-Encoding`` (gzip, deflate), both ways; ``accept_encoding``: the
  coding a response gets from ``Accept-Encoding``.
- ``resources``: the Falcon resources; the infer route parses the request into
  the data plane's ``InputTensor``s and calls the data plane.
- ``render``: an ``InferResult`` as a JSON or binary-extension response.
- ``error_handlers``: every error as ``{"error": ...}`` with its status.
- ``binary``, ``encode``, ``media``: where the binary extension's chunks lie; the response
  encoders; the media types and header names of the wire format.
- ``restricted``: a route put behind its API group's header (``--http-restricted-api``).
- ``admin``, ``shared_memory``: the management routes (``oipserve.management``) and the
  shared-memory extensions' routes.

The infer route reads the raw body itself (never through Falcon's media
handlers) and decodes it once with a typed msgspec decoder. Bodies that carry
binary tensors are received straight into a pooled shared-memory segment, and
large binary outputs are sent as views of the worker's output segment.

``create_app`` is the package's entry point (``oipserve.app.server`` builds the app
with it).
"""

from oipserve.front.rest.app import create_app

__all__ = ["create_app"]
