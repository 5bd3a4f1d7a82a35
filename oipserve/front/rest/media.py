"""Media types and header names of the REST wire format, shared by the REST modules."""

from __future__ import annotations

JSON = "application/json"
OCTET_STREAM = "application/octet-stream"
#: The binary tensor extension: bytes of JSON header before the first binary chunk.
HEADER_LENGTH = "Inference-Header-Content-Length"
