"""A model's ``dynamic_batching`` block, checked as Triton checks it at load.

``batch_policy`` turns the parsed ``inference.ModelDynamicBatching`` message into a
``BatchPolicy`` the scheduler reads (times in nanoseconds, priority levels counted
from 1, a ``QueuePolicy`` for each level). Defaults and load errors follow Triton's
``NormalizeModelConfig``/``ValidateModelConfig`` (see docs/scheduler.md):
``preferred_batch_size`` defaults to ``[max_batch_size]``; sizes must lie in
``[1, max_batch_size]`` (none with max_batch_size 0); ``default_priority_level`` must lie
in ``[1, priority_levels]`` when there are levels; ``preserve_ordering`` cannot be combined
with more than one priority level or with a DELAY timeout (Triton's messages).

Nothing here is sized by ``priority_levels``: it is a number (up to 2^64 in Triton's
schema), and the levels without a ``priority_queue_policy`` entry of their own share the
default policy instead of getting a copy each (a copy per level made a load with
``priority_levels: 1000000000`` take 55 s and 7.7 GB). The bound on the number itself is
``oipserve.models.config.parse.ConfigLimits``.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

__all__ = ["BatchPolicy", "BatchPolicyError", "QueuePolicy", "batch_policy"]


class BatchPolicyError(ValueError):
    """A dynamic_batching block Triton would refuse at load."""


class QueuePolicy(msgspec.Struct, frozen=True):
    """``ModelQueuePolicy``: how long a request may wait, and how many may wait."""

    timeout_action: Literal["REJECT", "DELAY"] = "REJECT"
    #: 0: no timeout.
    default_timeout_ns: int = 0
    allow_timeout_override: bool = False
    #: 0: unbounded.
    max_queue_size: int = 0

    def timeout_ns(self, requested_us: int) -> int:
        """The effective timeout of a request that asked for ``requested_us`` (0: none).

        Triton's rule (scheduler_utils.cc): the request's value replaces the default only
        when overriding is allowed and it is non-zero and strictly smaller than the
        default. With the default of 0 (no timeout) a request's own timeout is ignored.
        """
        requested = requested_us * 1000
        if self.allow_timeout_override and 0 < requested < self.default_timeout_ns:
            return requested
        return self.default_timeout_ns


class BatchPolicy(msgspec.Struct, frozen=True):
    """What the dynamic batcher of one model version does."""

    #: The model's max_batch_size; 0 means requests cannot be joined (one per execution).
    max_batch_size: int
    #: Sorted; never empty when max_batch_size > 0 (defaults to [max_batch_size]).
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_ns: int = 0
    preserve_ordering: bool = False
    #: At least 1; level 1 is served first.
    priority_levels: int = 1
    default_priority_level: int = 1
    #: The policy of every level not in ``level_policies``.
    default_queue_policy: QueuePolicy = QueuePolicy()
    #: The levels given a policy of their own (``priority_queue_policy``), and only those.
    level_policies: dict[int, QueuePolicy] = msgspec.field(default_factory=dict)

    @property
    def largest_batch(self) -> int:
        """Batch elements one execution may hold."""
        return max(self.max_batch_size, 1)

    def level(self, priority: int) -> int:
        """The queue level (1 = highest) of a request's ``priority`` parameter.

        Triton's ``InferenceRequest::SetPriority``: 0, or a priority past the last
        level, means the default level (not the last one).
        """
        if priority == 0 or priority > self.priority_levels:
            return self.default_priority_level
        return priority

    def policy(self, level: int) -> QueuePolicy:
        """The queue policy of ``level`` (1 to ``priority_levels``)."""
        return self.level_policies.get(level, self.default_queue_policy)


def _queue_policy(message: Any) -> QueuePolicy:
    action: Literal["REJECT", "DELAY"] = "DELAY" if message.timeout_action == 1 else "REJECT"
    return QueuePolicy(
        timeout_action=action,
        default_timeout_ns=int(message.default_timeout_microseconds) * 1000,
        allow_timeout_override=bool(message.allow_timeout_override),
        max_queue_size=int(message.max_queue_size),
    )


def _check_preserve_ordering(message: Any, levels: int, model: str) -> None:
    """Triton's checks (and words): one level only, and no policy with a DELAY timeout,
    the default policy and every ``priority_queue_policy`` entry alike."""
    if levels > 1:
        raise BatchPolicyError(
            f"Only one priority level is allowed when 'preserve_ordering' is true for {model}"
        )
    policies = [message.default_queue_policy, *message.priority_queue_policy.values()]
    if any(p.timeout_action == 1 and p.default_timeout_microseconds for p in policies):
        raise BatchPolicyError(
            "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is "
            f"true for {model}"
        )


def batch_policy(message: Any, max_batch_size: int, model: str) -> BatchPolicy:
    """The policy of a parsed ``ModelDynamicBatching``; BatchPolicyError as Triton's load."""
    preferred = sorted(set(int(s) for s in message.preferred_batch_size))
    for size in preferred:
        if size < 1:
            raise BatchPolicyError(f"dynamic batching preferred size must be positive for {model}")
        if size > max_batch_size:  # with max_batch_size 0 every size is refused, as Triton
            raise BatchPolicyError(
                f"dynamic batching preferred size must be <= max batch size for {model}"
            )
    if not preferred and max_batch_size > 0:
        preferred = [max_batch_size]
    levels = int(message.priority_levels)
    default_level = int(message.default_priority_level)
    if levels and not 1 <= default_level <= levels:
        raise BatchPolicyError(f"default priority level must be in range [1, {levels}] for {model}")
    default_policy = _queue_policy(message.default_queue_policy)
    by_level = {}
    for level, policy in message.priority_queue_policy.items():
        # NOTE: without levels Triton checks no entry's level, and no level uses one.
        if levels and not 1 <= int(level) <= levels:
            raise BatchPolicyError(
                f"priority queue policy must have priority level in range [1, {levels}] for {model}"
            )
        if levels:
            by_level[int(level)] = _queue_policy(policy)
    if message.preserve_ordering:
        _check_preserve_ordering(message, levels, model)
    return BatchPolicy(
        max_batch_size=max_batch_size,
        preferred_batch_sizes=tuple(preferred),
        max_queue_delay_ns=int(message.max_queue_delay_microseconds) * 1000,
        preserve_ordering=bool(message.preserve_ordering),
        priority_levels=max(levels, 1),
        default_priority_level=default_level if levels else 1,
        default_queue_policy=default_policy,
        level_policies=by_level,
    )
