"""The OIP gRPC surface: a thin adapter over the DataPlane, like ``oipserve.rest``.

Every RPC parses its message into the data plane's types, calls it, and
renders the answer; validation, placement in shared memory and dispatch to
workers happen once, in ``DataPlane``. One job per module:

- ``codec``: the ModelInfer wire format without protobuf's copies
  (``raw_input_contents`` split off as views, the response written by hand).
- ``convert``: protobuf tensors and parameters as the data plane's types.
- ``service``: the RPC handlers (``InferenceService``).
- ``handlers``: the method table (parse, answer, write), unsupported RPCs as
  UNIMPLEMENTED.
- ``streaming``: ModelStreamInfer's ordered, concurrent responses.
- ``status``: the one place an exception becomes a gRPC status.
- ``server``: the RPCs of the service and the drain (``GrpcServer``).
- ``start``: the service on the front's own HTTP/2 (``oipserve.grpc_h2``), in this
  process; with ``--http-workers`` every front serves it the same way.

(The package is not named ``grpc``, which would shadow grpcio.)
"""
