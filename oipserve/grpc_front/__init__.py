"""The OIP gRPC surface: a thin adapter over the DataPlane, like ``oipserve.rest``.

Every RPC parses its message into the data plane's types, calls it, and
renders the answer; validation, placement in shared memory and dispatch to
workers happen once, in ``DataPlane``. One job per module:

- ``codec``: the ModelInfer wire format without protobuf's copies
  (``raw_input_contents`` split off as views, the response written by hand).
- ``convert``: protobuf tensors and parameters as the data plane's types.
- ``service``: the RPC handlers (``InferenceService``).
- ``handlers``: the method table (parse, answer, write) and its grpc.aio handlers,
  unsupported RPCs as UNIMPLEMENTED.
- ``streaming``: ModelStreamInfer's ordered, concurrent responses.
- ``status``: the one place an exception becomes a gRPC status.
- ``server``: a grpc.aio server over any handler table: binding, the drain (``GrpcServer``).
- ``start``: the service on grpc.aio in the front process (``--grpc-processes 0``), or
  forwarded from gRPC processes (``oipserve.grpc_relay``).

``oipserve.grpc_relay`` and ``oipserve.grpc_process`` serve the same table from
separate processes (``--grpc-processes N``). This package's ``__init__`` imports
nothing, so that a gRPC process can use ``server`` and ``streaming`` without the
data plane. (The package is not named ``grpc``, which would shadow grpcio.)
"""
