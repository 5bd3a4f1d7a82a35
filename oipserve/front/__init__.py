"""The protocol edges, each a thin adapter over the data plane.

- ``http/``: HTTP/1.1 under the REST app (uvicorn's protocol with our limits).
- ``rest/``: the Falcon app, its resources, bodies, rendering and content coding.
- ``grpc/``: gRPC calls over the front's own HTTP/2 (``grpc/h2/``), the RPC tables.
- ``header_rules``: the request-header rules every front applies (one table).
"""
