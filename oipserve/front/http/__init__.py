"""HTTP/1.1 under the REST app: uvicorn's httptools protocol with coalesced writes, bodies
received straight into shared memory and the connection limits (``protocol``), a chunked
body's declared sizes (``chunk_sizes``), and the uvicorn servers of the HTTP and metrics
ports (``server``); and the REST app on HTTP/2 streams that are not gRPC (``h2_asgi``:
REST over h2c, for Knative's single port).
"""
