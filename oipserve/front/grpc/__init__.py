"""The OIP gRPC surface: a thin adapter over the DataPlane, like ``oipserve.front.rest``.

Every RPC parses its message into the data plane's types, calls it, and
renders the answer; validation, placement in shared memory and dispatch to
workers happen once, in ``DataPlane``. One job per module:

- ``codec``: the ModelInfer wire format without protobuf's copies
  (``raw_input_contents`` split off as views, the response written by hand); ``varint``:
  protobuf's varint, for messages assembled from parts.
- ``convert``: protobuf tensors and parameters as the data plane's types.
- ``service``: the RPC handlers (``InferenceService``).
- ``handlers``: the method table (parse, answer, write), unsupported RPCs as
  UNIMPLEMENTED.
- ``streaming``: ModelStreamInfer's ordered, concurrent responses.
- ``status``: the one place an exception becomes a gRPC status.
- ``rpcs``: the RPCs of the service and the drain (``GrpcServer``).
- ``call``, ``call_table``, ``tables``, ``handler_context``, ``inflate``: one call on an
  HTTP/2 stream (limits, restrictions, deadlines, messages into segments), what every call
  shares, a handler's view of its call, bounded inflation. ``Call`` is one class in
  layers, a module each: ``call`` (headers, deadline) over ``call_receive`` (messages
  read) over ``call_run`` (the method run) over ``call_send`` (the reply written) over
  ``call_state`` (the call's state, its window, its end).
- ``listener``: the port and its stop; ``linger``: a connection error's socket closed
  without losing its GOAWAY (briefly, a bounded number). ``h2/``: HTTP/2 itself.
- ``oipserve.app.grpc_start`` starts the service in every HTTP front.

(Absolute imports keep ``oipserve.front.grpc`` apart from grpcio's top-level ``grpc``,
whose status codes ``call`` and ``status`` use.)
"""
