"""HTTP/1.1 under the REST app, and the REST app on HTTP/2 streams.

``protocol``: uvicorn's httptools protocol with coalesced writes, bodies received straight
into shared memory and the connection's limits, beside what it judges with: ``limits``
(the limits and deadlines of a connection), ``chunk_sizes`` (a chunked body's declared
sizes) and ``h2c`` (HTTP/2's preface on the HTTP port). ``extensions``: what the HTTP
fronts give the REST app beyond ASGI. ``server``: the uvicorn servers of the HTTP and
metrics ports. ``h2_asgi``: the REST app on HTTP/2 streams that are not gRPC (REST over
h2c, for Knative's single port), with ``h2_head`` (a request's scope and a response's
header block) and ``h2_connection`` (the listener's HTTP/2 connection, which can end such
a stream with its last DATA).
"""
