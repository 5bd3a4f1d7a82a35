"""The OIP gRPC surface: a thin adapter over the DataPlane, like ``oipserve.rest``.

Every RPC parses its message into the data plane's types, calls it, and
renders the answer; validation, placement in shared memory and dispatch to
workers happen once, in ``DataPlane``. One job per module:

- ``codec``: the ModelInfer wire format without protobuf's copies
  (``raw_input_contents`` split off as views, the response written by hand).
- ``convert``: protobuf tensors and parameters as the data plane's types.
- ``service``: the RPC handlers (``InferenceService``).
- ``handlers``: the method-handler table grpc.aio serves, every failure as a
  status, unsupported RPCs as UNIMPLEMENTED.
- ``status``: the one place an exception becomes a gRPC status.
- ``server``: binding, starting and the shutdown drain (``GrpcServer``).

(The package is not named ``grpc``, which would shadow grpcio for readers.)
"""

from oipserve.grpc_front.server import GrpcServer, start_grpc

__all__ = ["GrpcServer", "start_grpc"]
