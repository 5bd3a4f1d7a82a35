"""HTTP/2 as the gRPC port speaks it, and nothing of gRPC: ``frames`` (the wire),
``headers`` (HPACK decoding, cached), ``connection`` (one client's frames, streams and flow
control). The gRPC call on a stream is ``front.grpc.call``'s.
"""
