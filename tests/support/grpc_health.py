"""gRPC's standard health check (``grpc.health.v1.Health/Check``), called as Kubernetes'
``grpc`` probe and grpc-health-probe call it: with grpcio, on a channel of its own."""

from __future__ import annotations

import grpc

from oipserve.grpc_generated import health_pb2

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def health_check(target: str, metadata: tuple[tuple[str, str], ...] = ()) -> int:
    """The status ``target`` (host:port) answers; grpc.RpcError when it refuses."""
    with grpc.insecure_channel(target) as channel:
        return health_check_on(channel, metadata)


def health_check_on(channel: grpc.Channel, metadata: tuple[tuple[str, str], ...] = ()) -> int:
    """The same on a channel already open (a tritonclient client's, say)."""
    check = channel.unary_unary(
        "/grpc.health.v1.Health/Check",
        request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
        response_deserializer=health_pb2.HealthCheckResponse.FromString,
    )
    answer = check(health_pb2.HealthCheckRequest(service=""), metadata=metadata, timeout=30)
    return int(answer.status)
