"""Restricted APIs, as Triton does them: API groups, the flag syntax, and the one check.

``--http-restricted-api=<api>[,<api>...]:<header>=<value>`` and
``--grpc-restricted-protocol=<api>[,<api>...]:<key>=<value>`` put API groups behind
a header (HTTP) or a metadata key ``triton-grpc-protocol-<key>`` (gRPC) that
must carry ``value`` exactly. This module holds what both fronts share: the
group names (Triton's, plus ``hardware`` and ``workers``), which REST route and
which RPC belongs to which group, the parser, and the comparison. The fronts
look a route's or an RPC's group up once, when the route or handler is
registered, so an unrestricted API costs nothing per request (docs/security.md).
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Iterable, Mapping

import msgspec

#: Every API group, Triton's names first. Groups with no route or RPC here
#: (``trace``, ``logging`` over HTTP) are still accepted, so
#: that a Triton command line keeps working.
API_GROUPS: tuple[str, ...] = (
    "health",
    "metadata",
    "inference",
    "shared-memory",
    "model-config",
    "model-repository",
    "statistics",
    "trace",
    "logging",
    "hardware",
    "workers",
)

#: Triton's prefix of the gRPC metadata key: ``admin-key`` is sent as
#: ``triton-grpc-protocol-admin-key`` (tritonclient users already write it so).
GRPC_KEY_PREFIX = "triton-grpc-protocol-"

#: REST route template -> API group. ``_App.add_route`` refuses a template that
#: is missing here, so a new route cannot be added without deciding its group.
HTTP_ROUTES: Mapping[str, str] = {
    "/v2": "metadata",
    "/v2/health/live": "health",
    "/v2/health/ready": "health",
    "/v2/models/{model}": "metadata",
    "/v2/models/{model}/versions/{version}": "metadata",
    "/v2/models/{model}/ready": "health",
    "/v2/models/{model}/versions/{version}/ready": "health",
    "/v2/models/{model}/config": "model-config",
    "/v2/models/{model}/versions/{version}/config": "model-config",
    "/v2/models/{model}/infer": "inference",
    "/v2/models/{model}/versions/{version}/infer": "inference",
    "/v2/models/stats": "statistics",
    "/v2/models/{model}/stats": "statistics",
    "/v2/models/{model}/versions/{version}/stats": "statistics",
    # NOTE: the served-model list answers what metadata requests would find out
    #   one name at a time; it changes nothing, so it is not model-repository.
    "/v2/models": "metadata",
    "/v2/repository/index": "model-repository",
    "/v2/repository/models/{model}/load": "model-repository",
    "/v2/repository/models/{model}/unload": "model-repository",
    "/v2/repository/models/{model}/versions/{version}/load": "model-repository",
    "/v2/repository/models/{model}/versions/{version}/unload": "model-repository",
    "/v2/models/{model}/load": "model-repository",
    "/v2/models/{model}/unload": "model-repository",
    # Triton's routes naming a repository, which it refuses (and so does this server).
    "/v2/repository/{repository}/index": "model-repository",
    "/v2/repository/{repository}/models/{model}/load": "model-repository",
    "/v2/repository/{repository}/models/{model}/unload": "model-repository",
    "/v2/hardware": "hardware",
    "/v2/workers/{worker}": "workers",
    "/v2/workers/{worker}/load": "workers",
    "/v2/workers/{worker}/unload": "workers",
    **{
        f"/v2/{kind}sharedmemory{route}": "shared-memory"
        for kind in ("system", "cuda")
        for route in (
            "/status",
            "/region/{region}/status",
            "/region/{region}/register",
            "/unregister",
            "/region/{region}/unregister",
        )
    },
}

#: gRPC method of ``inference.GRPCInferenceService`` -> API group (Triton's grouping).
GRPC_METHODS: Mapping[str, str] = {
    "ServerLive": "health",
    "ServerReady": "health",
    "grpc.health.v1.Health/Check": "health",  # gRPC's standard health check, as Triton's
    "ModelReady": "health",
    "ServerMetadata": "metadata",
    "ModelMetadata": "metadata",
    "ModelInfer": "inference",
    "ModelStreamInfer": "inference",
    "ModelConfig": "model-config",
    "ModelStatistics": "statistics",
    "RepositoryIndex": "model-repository",
    "RepositoryModelLoad": "model-repository",
    "RepositoryModelUnload": "model-repository",
    "SystemSharedMemoryStatus": "shared-memory",
    "SystemSharedMemoryRegister": "shared-memory",
    "SystemSharedMemoryUnregister": "shared-memory",
    "CudaSharedMemoryStatus": "shared-memory",
    "CudaSharedMemoryRegister": "shared-memory",
    "CudaSharedMemoryUnregister": "shared-memory",
    "TraceSetting": "trace",
    "LogSettings": "logging",
}

# An HTTP header name is an RFC 9110 token; a gRPC metadata key is narrower
# (lower case, digits, "-", "_", ".") and one ending in "-bin" carries bytes.
_HTTP_HEADER = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_GRPC_KEY = re.compile(r"[0-9a-z_.\-]+")
# Printable ASCII: what both an HTTP header value and a gRPC ASCII metadata value can carry.
_VALUE = re.compile(r"[\x21-\x7e]([\x20-\x7e]*[\x21-\x7e])?")


class Restriction(msgspec.Struct, frozen=True):
    """One flag: these API groups need ``header`` (lower case) to carry ``value``."""

    apis: tuple[str, ...]
    header: str
    value: str

    def __repr__(self) -> str:
        # The value is a secret: keep it out of logs and tracebacks that print settings.
        return f"Restriction(apis={self.apis!r}, header={self.header!r}, value='***')"


class RestrictionError(ValueError):
    """A restriction flag is malformed or restricts an API twice; the message says how."""


def parse_restriction(spec: str, *, grpc: bool) -> Restriction:
    """``<api>[,<api>...]:<key>=<value>`` as a ``Restriction``.

    The APIs end at the first ``:`` and the key at the first ``=`` after it, so a
    value may contain both (base64 tokens end in ``=``). For gRPC the key gets
    Triton's ``triton-grpc-protocol-`` prefix. Keys are lower-cased: HTTP header
    names are case-insensitive and gRPC sends metadata keys in lower case only.
    """
    apis_text, colon, assignment = spec.partition(":")
    key, equals, value = assignment.partition("=")
    # The value is a secret: messages show the flag with it masked.
    shown = repr(f"{apis_text}:{key}=***" if equals else apis_text + colon + "***" * bool(colon))
    if not colon or not equals:
        raise RestrictionError(f"{shown} is not of the form <api>[,<api>...]:<key>=<value>")
    apis = tuple(api.strip() for api in apis_text.split(","))
    for api in apis:
        if api not in API_GROUPS:
            name = repr(api) if api else "an empty name"
            raise RestrictionError(  # Triton's words first: scripts grep its log for them
                f"unknown restricted api {api!r}: {shown} names {name}; "
                f"the APIs are {', '.join(API_GROUPS)}"
            )
    if len(set(apis)) != len(apis):
        raise RestrictionError(f"{shown} names an API twice")
    key = key.strip().lower()
    pattern = _GRPC_KEY if grpc else _HTTP_HEADER
    if not pattern.fullmatch(key) or (grpc and key.endswith("-bin")):
        what = "a gRPC metadata key" if grpc else "an HTTP header name"
        raise RestrictionError(f"{shown}: {key!r} is not {what}")
    if not _VALUE.fullmatch(value):
        raise RestrictionError(
            f"{shown}: the value must be printable ASCII, not empty, without spaces at either end"
        )
    return Restriction(apis, GRPC_KEY_PREFIX + key if grpc else key, value)


def parse_restrictions(specs: Iterable[str], *, grpc: bool) -> tuple[Restriction, ...]:
    """Every flag of one front, each API restricted at most once (as Triton insists)."""
    restrictions = tuple(parse_restriction(spec, grpc=grpc) for spec in specs)
    by_api(restrictions)
    return restrictions


def by_api(restrictions: Iterable[Restriction]) -> dict[str, Restriction]:
    """API group -> its restriction; an API in two restrictions is an error."""
    table: dict[str, Restriction] = {}
    for restriction in restrictions:
        for api in restriction.apis:
            if api in table:
                raise RestrictionError(
                    f"api '{api}' can not be specified in multiple config groups: "
                    f"the {api} API is restricted twice; each API may be in one restriction only"
                )
            table[api] = restriction
    return table


def allows(restriction: Restriction, sent: str | None) -> bool:
    """Whether the header or metadata value a request ``sent`` opens ``restriction``.

    Compared in constant time, so the answer's timing tells nothing of the value.
    """
    return sent is not None and hmac.compare_digest(sent.encode(), restriction.value.encode())


def denial(api: str, restriction: Restriction, *, grpc: bool) -> str:
    """The client's message: Triton's text, naming the API and the header, never the value."""
    what = "protocol" if grpc else "API"
    return f"This {what} is restricted, expecting header '{restriction.header}' ({api})"
