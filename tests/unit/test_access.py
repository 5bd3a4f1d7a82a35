"""Restriction flags: syntax, the API tables, the environment form, secrets kept out of messages."""

from __future__ import annotations

import pytest

from oipserve.config.access import (
    API_GROUPS,
    GRPC_METHODS,
    HTTP_ROUTES,
    Restriction,
    RestrictionError,
    allows,
    parse_restriction,
    parse_restrictions,
)
from oipserve.config.settings import SettingsError, load_settings
from oipserve.grpc_generated import grpc_service_pb2 as pb

BASE = ["serve", "--model-repository", "x"]


def test_every_rpc_has_a_group() -> None:
    service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    health = "grpc.health.v1.Health/Check"  # gRPC's standard health check, too
    assert set(GRPC_METHODS) == {method.name for method in service.methods} | {health}
    assert set(GRPC_METHODS.values()) <= set(API_GROUPS)
    assert set(HTTP_ROUTES.values()) <= set(API_GROUPS)


def test_value_may_hold_colons_and_equals_and_key_is_lower_cased() -> None:
    restriction = parse_restriction("model-repository, workers:X-Admin=a:b==", grpc=False)
    assert restriction == Restriction(("model-repository", "workers"), "x-admin", "a:b==")


def test_grpc_key_gets_tritons_prefix() -> None:
    restriction = parse_restriction("inference:admin-key=v", grpc=True)
    assert restriction.header == "triton-grpc-protocol-admin-key"


@pytest.mark.parametrize(
    ("spec", "grpc", "fragment"),
    [
        ("inference", False, "is not of the form"),
        ("inference:admin", False, "is not of the form"),
        ("inference:=v", False, "is not an HTTP header name"),
        ("inference:a b=v", False, "is not an HTTP header name"),
        ("inference:key-bin=v", True, "is not a gRPC metadata key"),
        ("inference:k/y=v", True, "is not a gRPC metadata key"),
        ("inference:k=", False, "printable ASCII"),
        ("inference:k= v", False, "printable ASCII"),
        ("inference:k=caf\u00e9", False, "printable ASCII"),
        ("infer:k=v", False, "unknown restricted api 'infer': .* names 'infer'"),
        ("inference,,health:k=v", False, "names an empty name"),
        ("health,health:k=v", False, "names an API twice"),
    ],
)
def test_malformed_restrictions(spec: str, grpc: bool, fragment: str) -> None:
    with pytest.raises(RestrictionError, match=fragment):
        parse_restriction(spec, grpc=grpc)


def test_an_api_restricted_twice_is_refused() -> None:
    with pytest.raises(
        RestrictionError,
        match="api 'health' can not be specified in multiple config groups: "
        "the health API is restricted twice",
    ):
        parse_restrictions(["health,metadata:a=1", "inference,health:b=2"], grpc=False)


def test_secret_is_never_shown() -> None:
    for spec in ("nope:k=topsecret", "health:topsecret", "health:k= topsecret"):
        with pytest.raises(RestrictionError) as caught:
            parse_restriction(spec, grpc=False)
        assert "topsecret" not in str(caught.value)
    assert "topsecret" not in repr(Restriction(("health",), "k", "topsecret"))


def test_allows_needs_the_exact_value() -> None:
    restriction = Restriction(("health",), "k", "v1")
    assert allows(restriction, "v1")
    assert not allows(restriction, None)
    assert not allows(restriction, "v10")
    assert not allows(restriction, "V1")


def test_flags_repeat_and_environment_separates_with_semicolons() -> None:
    argv = [*BASE, "--http-restricted-api", "health:a=1", "--http-restricted-api", "inference:b=2"]
    _, settings = load_settings(argv, {})
    assert [r.apis for r in settings.http_restricted_api] == [("health",), ("inference",)]
    env = {"OIPSERVE_GRPC_RESTRICTED_PROTOCOL": "health:a=1; model-repository,workers:b=x;y"}
    with pytest.raises(SettingsError):  # "y" alone is a second, malformed restriction
        load_settings(BASE, env)
    env = {"OIPSERVE_GRPC_RESTRICTED_PROTOCOL": "health:a=1; model-repository,workers:b=x=="}
    _, settings = load_settings(BASE, env)
    assert settings.grpc_restricted_protocol == (
        Restriction(("health",), "triton-grpc-protocol-a", "1"),
        Restriction(("model-repository", "workers"), "triton-grpc-protocol-b", "x=="),
    )
    # As for every flag, a flag replaces the environment's value.
    _, settings = load_settings([*BASE, "--grpc-restricted-protocol", "trace:c=3"], env)
    assert [r.apis for r in settings.grpc_restricted_protocol] == [("trace",)]


def test_settings_error_names_the_flag_and_environment_variable() -> None:
    with pytest.raises(SettingsError, match="--http-restricted-api .or OIPSERVE_HTTP_RESTRICTED"):
        load_settings([*BASE, "--http-restricted-api", "health:a b=1"], {})
