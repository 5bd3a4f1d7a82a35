"""HTTP/2 as the gRPC port speaks it, and nothing of gRPC: ``frames`` (the wire),
``headers`` (HPACK decoding, cached), ``stream_ids`` (which client stream ids are open,
skipped or closed, and what HEADERS on a closed one mean), ``connection`` (one client's
frames, streams and flow control, in layers: ``connection_state``, ``connection_send``,
``connection_receive``). The gRPC call on a stream is ``front.grpc.call``'s.
"""
