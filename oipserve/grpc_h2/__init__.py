"""gRPC served over the front's own HTTP/2, in every HTTP front: see docs/grpc.md.

``frames`` (the wire), ``headers`` (HPACK decoding, cached), ``connection`` (one
client's frames, streams and flow control), ``call`` (one gRPC call on a stream),
``call_table`` and ``tables`` (what every call of a server shares, and a front's table),
``handler_context`` (what a handler sees of its call), ``inflate`` (compressed messages),
``server`` (the listener and its stop).
"""
