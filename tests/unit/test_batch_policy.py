"""dynamic_batching blocks checked and normalised as Triton does at load."""

from __future__ import annotations

import pytest
from google.protobuf import text_format

from oipserve.grpc_generated import model_config_pb2 as mc
from oipserve.scheduling.policy import BatchPolicyError, QueuePolicy, batch_policy


def _policy(text: str, max_batch_size: int = 8):  # noqa: ANN202
    message = text_format.Parse(text, mc.ModelDynamicBatching())
    return batch_policy(message, max_batch_size, "m")


def test_an_empty_block_batches_up_to_max_batch_size_without_waiting() -> None:
    policy = _policy("")
    assert policy.preferred_batch_sizes == (8,)
    assert policy.max_queue_delay_ns == 0
    assert policy.priority_levels == 1 and policy.level(0) == 1
    assert policy.default_queue_policy == QueuePolicy() and policy.level_policies == {}


def test_keys_are_read_with_their_units() -> None:
    policy = _policy(
        """preferred_batch_size: [4, 2] max_queue_delay_microseconds: 500
        priority_levels: 2 default_priority_level: 2
        default_queue_policy { max_queue_size: 3 default_timeout_microseconds: 100
                               allow_timeout_override: true }
        priority_queue_policy { key: 1 value { timeout_action: DELAY
                                               default_timeout_microseconds: 7 } }"""
    )
    assert policy.preferred_batch_sizes == (2, 4)
    assert policy.max_queue_delay_ns == 500_000
    assert policy.level(0) == 2 and policy.level(1) == 1 and policy.level(9) == 2
    assert policy.policy(1) == QueuePolicy("DELAY", 7_000)
    assert policy.policy(2) == QueuePolicy("REJECT", 100_000, True, 3)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("preferred_batch_size: [0]", "preferred size must be positive for m"),
        ("preferred_batch_size: [9]", "preferred size must be <= max batch size for m"),
        ("priority_levels: 2 default_priority_level: 3", r"must be in range \[1, 2\] for m"),
        ("priority_levels: 2", r"must be in range \[1, 2\] for m"),
        (
            "priority_levels: 2 default_priority_level: 1 "
            "priority_queue_policy { key: 5 value { } }",
            "priority level in range",
        ),
        (
            "preserve_ordering: true priority_levels: 2 default_priority_level: 1",
            "Only one priority level is allowed when 'preserve_ordering' is true for m",
        ),
        (
            "preserve_ordering: true default_queue_policy "
            "{ timeout_action: DELAY default_timeout_microseconds: 5 }",
            "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true",
        ),
        (  # the default policy counts even when the one level has a policy of its own
            "preserve_ordering: true priority_levels: 1 default_priority_level: 1 "
            "default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 5 } "
            "priority_queue_policy { key: 1 value { } }",
            "Queue policy can not have DELAY",
        ),
    ],
)
def test_what_triton_refuses_is_refused(text: str, message: str) -> None:
    with pytest.raises(BatchPolicyError, match=message):
        _policy(text)


def test_without_max_batch_size_each_request_runs_alone() -> None:
    policy = _policy("", max_batch_size=0)
    assert policy.preferred_batch_sizes == () and policy.largest_batch == 1


def test_a_priority_past_the_last_level_gets_the_default_level() -> None:
    """Triton's InferenceRequest::SetPriority: not the last level, the default one."""
    policy = _policy("priority_levels: 3 default_priority_level: 2")
    assert [policy.level(p) for p in (0, 1, 3, 4, 2**64 - 1)] == [2, 1, 3, 2, 2]


def test_without_max_batch_size_a_preferred_size_is_refused() -> None:
    with pytest.raises(BatchPolicyError, match="preferred size must be <= max batch size"):
        _policy("preferred_batch_size: [1]", max_batch_size=0)


def test_without_levels_a_priority_queue_policy_is_ignored() -> None:
    """Triton checks an entry's level only when there are levels; none uses it."""
    policy = _policy("priority_queue_policy { key: 5 value { max_queue_size: 1 } }")
    assert policy.level_policies == {} and policy.policy(1) == QueuePolicy()
