"""Readiness and answers of a model through its life: loading, loaded, reloaded, unloaded."""

from __future__ import annotations

import pytest

from oipserve.errors import NotFound, Unavailable
from oipserve.models.registry import ModelRegistry, ModelVersion


def test_known_models_are_not_ready_and_unknown_ones_are_not_found() -> None:
    registry = ModelRegistry()
    with pytest.raises(NotFound):
        registry.model_ready("m", None)
    registry.loading.add("m")
    assert registry.model_ready("m", None) is False
    with pytest.raises(Unavailable, match="is being loaded"):
        registry.resolve("m", None)
    registry.loading.discard("m")
    registry.unloaded.add("m")
    assert registry.model_ready("m", None) is False
    with pytest.raises(NotFound, match="it was unloaded"):
        registry.resolve("m", None)


@pytest.mark.parametrize("why", ["unloaded", "replaced by a reload"])
def test_a_request_that_found_a_version_before_it_went_gets_a_retryable_503(why: str) -> None:
    model = ModelVersion("m", "1", "", None)
    model.state = "UNLOADING"
    model.reason = why
    for call in (lambda: model.pick(10), model.check_serving):
        with pytest.raises(Unavailable, match=f"was {why} while this request was in flight") as e:
            call()
        assert e.value.retry_after == 1
