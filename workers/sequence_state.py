"""Implicit state of sequence models, kept in the worker that owns the sequences.

A model with ``sequence_batching { state [...] }`` has graph inputs and outputs the client
never sees: the state output of one request of a sequence is the state input of its next
request. The front sends every request of a sequence to one worker (``dataplane.sequenced``)
and says, per row of a batch, which sequence it is (``SequenceRows``); the state never
crosses to the front. A row's state is the initial one (zeros, or ``initial_state`` data)
on START, for an empty slot, and for a sequence this worker never saw; it is freed after
the END request ran, or when the front says the sequence went idle (``EndSequences``).
"""

from __future__ import annotations

import numpy as np

from oipserve.wire.datatypes import NUMPY_DTYPES
from oipserve.wire.messages import SequenceRows, SequenceState
from workers.runtime import RequestError

__all__ = ["SequenceStates"]


class StateMismatch(RequestError):
    """The states of a batch's rows have different shapes (a variable-sized state)."""


class SequenceStates:
    """Model key -> sequence handle -> state input name -> its value (one row)."""

    def __init__(self) -> None:
        self.models: dict[str, dict[int, dict[str, np.ndarray]]] = {}

    def feed(
        self, key: str, rows: SequenceRows, feeds: dict[str, object], names: list[str]
    ) -> list[str]:
        """Put each state input of the batch into ``feeds``; the outputs to compute:
        ``names`` and the state outputs."""
        if not rows.states:
            return names
        held = self.models.setdefault(key, {})
        for state in rows.states:
            values = []
            for handle, start in zip(rows.handles, rows.starts, strict=True):
                kept = held.get(handle) if handle and not start else None
                value = kept.get(state.input_name) if kept is not None else None
                values.append(_initial(state, rows.batched) if value is None else value)
            feeds[state.input_name] = _join(state.input_name, values, rows.batched)
        return [*names, *(s.output_name for s in rows.states if s.output_name not in names)]

    def keep(
        self, key: str, rows: SequenceRows, computed: list[str], values: list[object]
    ) -> tuple[list[str], list[object]]:
        """Keep each row's state outputs, free the ended sequences; the outputs for the
        client (``computed`` without the state outputs)."""
        if not rows.states:
            self._end(key, [h for h, end in zip(rows.handles, rows.ends, strict=True) if end])
            return computed, values
        held = self.models.setdefault(key, {})
        by_name = dict(zip(computed, values, strict=True))
        for state in rows.states:
            batch = np.asarray(by_name[state.output_name])
            for row, handle in enumerate(rows.handles):
                if handle:
                    part = batch[row : row + 1] if rows.batched else batch
                    held.setdefault(handle, {})[state.input_name] = part.copy()
        self._end(key, [h for h, end in zip(rows.handles, rows.ends, strict=True) if end])
        states = {s.output_name for s in rows.states}
        kept = [(n, v) for n, v in zip(computed, values, strict=True) if n not in states]
        return [n for n, _ in kept], [v for _, v in kept]

    def end(self, key: str, handles: list[int]) -> None:
        """Sequences that ended without an END request: their state is freed."""
        self._end(key, handles)

    def _end(self, key: str, handles: list[int]) -> None:
        held = self.models.get(key)
        if held is None:
            return
        for handle in handles:
            held.pop(handle, None)
        if not held:
            del self.models[key]

    def drop_model(self, key: str) -> None:
        """The model was unloaded: every state of its sequences goes."""
        self.models.pop(key, None)


def _initial(state: SequenceState, batched: bool) -> np.ndarray:
    shape = [1, *state.shape] if batched else list(state.shape)
    dtype = NUMPY_DTYPES[state.datatype]
    if state.initial:
        count = 1
        for dim in shape:
            count *= dim
        return np.frombuffer(state.initial, dtype=dtype, count=count).reshape(shape)
    return np.zeros(shape, dtype=dtype)


def _join(name: str, values: list[np.ndarray], batched: bool) -> np.ndarray:
    if not batched:
        return values[0]
    if len(values) == 1:
        return values[0]
    shapes = {v.shape[1:] for v in values}
    if len(shapes) > 1:
        raise StateMismatch(
            f"state '{name}' has different shapes in the sequences of one batch: "
            f"{sorted(list(s) for s in shapes)}"
        )
    return np.concatenate(values)
