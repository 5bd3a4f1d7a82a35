"""gRPC served over the front's own HTTP/2 (``--grpc-processes 0``): see docs/grpc.md.

``frames`` (the wire), ``headers`` (HPACK decoding, cached), ``connection`` (one
client's frames, streams and flow control), ``call`` (one gRPC call on a stream),
``server`` (the listener and its stop).
"""
