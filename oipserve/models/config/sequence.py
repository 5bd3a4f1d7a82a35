"""``sequence_batching`` of a config.pbtxt: read into a ``SequencePolicy``, checked at load.

A stateful model gets one request of a sequence at a time, in order, on the one instance
(worker) that owns the sequence (``oipserve.dataplane.sequenced``). The configuration says
which strategy picks the requests of a batch (``direct``: a slot per sequence for its life;
``oldest``: the oldest requests of up to ``max_batch_size`` candidate sequences), which
control inputs the scheduler adds to each request (START, END, READY, CORRID) and what
implicit state the worker carries from one request of a sequence to the next.

The checks and their messages are Triton's (its model_config_utils.cc and
sequence_batch_scheduler.cc), so that a repository moved from Triton fails in the same words.
The state's initial data is read here, at load, from the version's ``initial_state/`` folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import msgspec

from oipserve.grpc_generated import model_config_pb2 as mc
from oipserve.wire.datatypes import BY_TRITON, DATATYPES

__all__ = [
    "Control",
    "SequenceConfigError",
    "SequencePolicy",
    "StateConfig",
    "read_initial_states",
    "sequence_policy",
]

_SB = mc.ModelSequenceBatching
_KINDS = {
    _SB.Control.CONTROL_SEQUENCE_START: "START",
    _SB.Control.CONTROL_SEQUENCE_END: "END",
    _SB.Control.CONTROL_SEQUENCE_READY: "READY",
    _SB.Control.CONTROL_SEQUENCE_CORRID: "CORRID",
}
_CORRID_TYPES = ("TYPE_UINT64", "TYPE_INT64", "TYPE_UINT32", "TYPE_INT32", "TYPE_STRING")
#: Triton's default ``max_sequence_idle_microseconds`` (when 0 or not given): one second.
DEFAULT_IDLE_US = 1_000_000
#: The folder of a model's directory that ``initial_state.data_file`` names files in.
INITIAL_STATE_FOLDER = "initial_state"


class SequenceConfigError(ValueError):
    """A ``sequence_batching`` block Triton would refuse at load."""


class Control(msgspec.Struct, frozen=True):
    """One control input the scheduler adds to every request of the model."""

    #: START, END, READY or CORRID.
    kind: str
    #: The graph input it fills.
    name: str
    #: OIP datatype (INT32, FP32, BOOL; CORRID: its ``data_type``).
    datatype: str
    false_value: float | int | bool = 0
    true_value: float | int | bool = 1


class StateConfig(msgspec.Struct, frozen=True):
    """One implicit state: ``output_name`` of a request feeds ``input_name`` of the next."""

    input_name: str
    output_name: str
    datatype: str
    dims: tuple[int, ...]
    #: ``initial_state``: its dims (no -1), and its data file (relative to the model's
    #: ``initial_state/`` folder) or "" for zeros; None: zeros, with -1 dims as 1 (Triton).
    initial_dims: tuple[int, ...] | None = None
    initial_file: str = ""
    #: The initial data, read at load (``read_initial_states``); empty: zeros.
    initial_data: bytes = b""


class SequencePolicy(msgspec.Struct, frozen=True):
    """What the sequence batcher needs of a ``sequence_batching`` block."""

    strategy: Literal["direct", "oldest"] = "direct"
    #: Nanoseconds a sequence may have nothing queued or running before it loses its slot.
    idle_ns: int = DEFAULT_IDLE_US * 1000
    controls: tuple[Control, ...] = ()
    states: tuple[StateConfig, ...] = ()
    #: direct: how long a batch may wait for ``minimum_slot_utilization`` of the slots.
    #: oldest: how long the oldest request may wait for a preferred batch size.
    max_queue_delay_ns: int = 0
    minimum_slot_utilization: float = 0.0
    #: oldest only: the sequences that may hold a candidate place on one instance.
    max_candidate_sequences: int = 0
    preferred_batch_sizes: tuple[int, ...] = ()
    preserve_ordering: bool = False

    def control(self, kind: str) -> Control | None:
        for control in self.controls:
            if control.kind == kind:
                return control
        return None

    @property
    def input_names(self) -> frozenset[str]:
        """Graph inputs the server fills (controls, states): clients never send them."""
        return frozenset([c.name for c in self.controls] + [s.input_name for s in self.states])

    @property
    def output_names(self) -> frozenset[str]:
        """Graph outputs that are states: kept by the worker, never sent to clients."""
        return frozenset(s.output_name for s in self.states)


def _values(control: Any, kind: str, model: str) -> tuple[str, list[Any]]:
    """The datatype and [false, true] of a boolean control (Triton's checks)."""
    given = [
        (name, list(getattr(control, field)))
        for name, field in (
            ("INT32", "int32_false_true"),
            ("FP32", "fp32_false_true"),
            ("BOOL", "bool_false_true"),
        )
        if len(getattr(control, field))
    ]
    if not given:
        raise SequenceConfigError(
            "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or "
            f"'bool_false_true' for CONTROL_SEQUENCE_{kind} for {model}"
        )
    if len(given) > 1:
        raise SequenceConfigError(
            "sequence batching specifies more than one from 'int32_false_true', "
            f"'fp32_false_true' and 'bool_false_true' for CONTROL_SEQUENCE_{kind} for {model}"
        )
    datatype, values = given[0]
    if len(values) != 2:
        field = {"INT32": "int32", "FP32": "fp32", "BOOL": "bool"}[datatype]
        raise SequenceConfigError(
            f"sequence batching control '{field}_false_true' must have exactly 2 entries for "
            f"CONTROL_SEQUENCE_{kind} for {model}"
        )
    return datatype, values


def _control(name: str, control: Any, model: str) -> Control:
    kind = _KINDS.get(control.kind)
    if kind is None:
        raise SequenceConfigError(f"sequence batching control of unknown kind for {model}")
    if kind != "CORRID":
        datatype, (false_value, true_value) = _values(control, kind, model)
        return Control(kind, name, datatype, false_value, true_value)
    if any(len(getattr(control, f)) for f in ("int32_false_true", "fp32_false_true")) or len(
        control.bool_false_true
    ):
        raise SequenceConfigError(
            "sequence batching must not specify either 'int32_false_true', 'fp32_false_true' "
            f"or 'bool_false_true' for CONTROL_SEQUENCE_CORRID for {model}"
        )
    triton = mc.DataType.Name(control.data_type)
    if triton not in _CORRID_TYPES:
        raise SequenceConfigError(
            f"unexpected data type for control CONTROL_SEQUENCE_CORRID for {model}. Allowed "
            "data types are TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING"
        )
    return Control(kind, name, BY_TRITON[triton].name)


def _controls(batching: Any, model: str) -> tuple[Control, ...]:
    controls: list[Control] = []
    seen: set[str] = set()
    for entry in batching.control_input:
        if not entry.name:
            raise SequenceConfigError(
                f"sequence batching control tensor must have a name for {model}"
            )
        if entry.name in seen:
            raise SequenceConfigError(
                f"sequence batching control tensor '{entry.name}' is specified for multiple "
                f"control kinds for {model}"
            )
        seen.add(entry.name)
        for control in entry.control:
            made = _control(entry.name, control, model)
            if any(c.kind == made.kind for c in controls):
                raise SequenceConfigError(
                    f"sequence batching specifies multiple CONTROL_SEQUENCE_{made.kind} "
                    f"tensors for {model}"
                )
            controls.append(made)
    return tuple(controls)


def _state(entry: Any, model: str, seen: set[str]) -> StateConfig:
    name = entry.input_name
    if not name or not entry.output_name:
        raise SequenceConfigError(
            f"sequence batching state must have both 'input_name' and 'output_name' for {model}"
        )
    if entry.data_type == mc.TYPE_INVALID:
        raise SequenceConfigError(f"sequence batching state '{name}' must have a data_type")
    if name in seen:
        raise SequenceConfigError(f"State input name '{name}' specified more than once.")
    seen.add(name)
    dims = tuple(int(d) for d in entry.dims)
    if any(d < 1 and d != -1 for d in dims):
        raise SequenceConfigError(
            f"sequence batching state '{name}': dims {list(dims)} must be -1 or positive"
        )
    datatype = BY_TRITON[mc.DataType.Name(entry.data_type)].name
    if datatype == "BYTES":
        raise SequenceConfigError(
            f"sequence batching state '{name}': TYPE_STRING states are not supported by oipserve"
        )
    if entry.use_growable_memory:
        raise SequenceConfigError(
            f"'use_growable_memory' can only work with KIND_GPU model instances; state "
            f"input '{name}' is kept in a worker's memory by oipserve"
        )
    if len(entry.initial_state) > 1:
        raise SequenceConfigError(
            f"initial_state field for state input '{name}' can contain exactly one value, "
            f"got '{len(entry.initial_state)}' elements."
        )
    if not entry.initial_state:
        return StateConfig(name, entry.output_name, datatype, dims)
    initial = entry.initial_state[0]
    _check_initial(initial, entry, dims)
    return StateConfig(
        name,
        entry.output_name,
        datatype,
        dims,
        tuple(int(d) for d in initial.dims),
        initial.data_file if initial.WhichOneof("state_data") == "data_file" else "",
    )


def _check_initial(initial: Any, entry: Any, dims: tuple[int, ...]) -> None:
    name = entry.input_name
    if initial.data_type != entry.data_type:
        raise SequenceConfigError(
            f"The data type used for 'initial_state' field of state '{name}' does not match "
            "the state data type."
        )
    if not initial.name:
        raise SequenceConfigError(
            f"Field 'name' must be set when using initial_state for state input '{name}'."
        )
    if len(initial.dims) != len(dims):
        raise SequenceConfigError(
            "Number of dimensions in 'initial_state' doesn't match the size of 'state' "
            f"dimensions for state input '{name}'. {len(initial.dims)} != {len(dims)}"
        )
    for given, declared in zip(initial.dims, dims, strict=True):
        if given == -1:
            raise SequenceConfigError(
                f"'initial_state' field for state input name '{name}' contains variable dimensions."
            )
        if declared != -1 and given != declared:
            raise SequenceConfigError(
                f"'initial_state' dim for input name '{name}' doesn't match 'state' dim "
                f"description. {given} != {declared}"
            )
    if initial.WhichOneof("state_data") is None:
        raise SequenceConfigError(
            f"initial_state setting expects state'{name}' to have state_data set"
        )
    if initial.data_type == mc.TYPE_STRING:
        raise SequenceConfigError(
            f"initial_state of state '{name}': TYPE_STRING states are not supported by oipserve"
        )


def _strategy(batching: Any, max_batch_size: int, model: str) -> dict[str, Any]:
    """The strategy's fields; Triton's range checks."""
    if batching.WhichOneof("strategy_choice") == "oldest":
        oldest = batching.oldest
        for size in oldest.preferred_batch_size:
            if size <= 0:
                raise SequenceConfigError(
                    f"sequence batching preferred batch size must be positive for {model}"
                )
            if size > max_batch_size:
                raise SequenceConfigError(
                    f"sequence batching preferred batch size must be <= max batch size for {model}"
                )
        return {
            "strategy": "oldest",
            "max_queue_delay_ns": oldest.max_queue_delay_microseconds * 1000,
            "max_candidate_sequences": oldest.max_candidate_sequences,
            "preferred_batch_sizes": tuple(sorted(set(oldest.preferred_batch_size)))
            or (max(max_batch_size, 1),),
            "preserve_ordering": oldest.preserve_ordering,
        }
    direct = batching.direct
    if not 0.0 <= direct.minimum_slot_utilization <= 1.0:
        raise SequenceConfigError(
            f"sequence batching minimum slot utilization must be in range (0.0, 1.0] for {model}"
        )
    return {
        "strategy": "direct",
        "max_queue_delay_ns": direct.max_queue_delay_microseconds * 1000,
        "minimum_slot_utilization": direct.minimum_slot_utilization,
    }


def sequence_policy(config: Any) -> SequencePolicy:
    """The ``sequence_batching`` of a parsed ``inference.ModelConfig``, checked as Triton does."""
    model = config.name
    batching = config.sequence_batching
    if config.response_cache.enable:
        raise SequenceConfigError(
            f"Response Cache does not currently support model {model} with sequence batching "
            "scheduler. Please disable the response cache."
        )
    if batching.iterative_sequence:
        raise SequenceConfigError(
            "sequence_batching.iterative_sequence: not supported by oipserve (it serves ONNX "
            "graphs, which answer once per request)"
        )
    seen: set[str] = set()
    states = tuple(_state(entry, model, seen) for entry in batching.state)
    idle_us = batching.max_sequence_idle_microseconds or DEFAULT_IDLE_US
    return SequencePolicy(
        idle_ns=idle_us * 1000,
        controls=_controls(batching, model),
        states=states,
        **_strategy(batching, config.max_batch_size, model),
    )


def read_initial_states(policy: SequencePolicy, model_dir: Path) -> SequencePolicy:
    """The policy with each state's initial data read from ``<model>/initial_state/``.

    A file shorter than the state's bytes is refused (Triton's message); the data is the
    file's first bytes, as in Triton.
    """
    if not any(s.initial_file for s in policy.states):
        return policy
    states = []
    for state in policy.states:
        if state.initial_file:
            state = msgspec.structs.replace(state, initial_data=_initial_data(state, model_dir))
        states.append(state)
    return msgspec.structs.replace(policy, states=tuple(states))


def _initial_data(state: StateConfig, model_dir: Path) -> bytes:
    folder = (model_dir / INITIAL_STATE_FOLDER).resolve()
    path = (folder / state.initial_file).resolve()
    if folder not in path.parents:
        raise SequenceConfigError(
            f"initial_state data_file '{state.initial_file}' of state '{state.input_name}' "
            f"must be a file in the model's {INITIAL_STATE_FOLDER}/ folder"
        )
    count = 1
    for dim in state.initial_dims or ():
        count *= dim
    need = count * DATATYPES[state.datatype].numpy.itemsize
    try:
        with path.open("rb") as file:
            data = file.read(need)
    except OSError as exc:
        raise SequenceConfigError(
            f"initial_state of state '{state.input_name}': cannot read {path.name}: {exc.strerror}"
        ) from None
    if len(data) < need:
        raise SequenceConfigError(
            f"initial_state setting expects {need} bytes, but the data provided from "
            f"{state.initial_file} only has {len(data)} bytes."
        )
    return data


def graph_problem(
    policy: SequencePolicy, inputs: dict[str, str], outputs: dict[str, str]
) -> str | None:
    """What keeps the ONNX graph from taking the controls and states the policy names
    (``inputs`` / ``outputs``: the graph's tensor -> its datatype), or None."""
    wanted = [
        (f"control input '{c.name}' (CONTROL_SEQUENCE_{c.kind})", c.name, c.datatype, inputs)
        for c in policy.controls
    ]
    for state in policy.states:
        wanted.append(
            (f"state input '{state.input_name}'", state.input_name, state.datatype, inputs)
        )
        wanted.append(
            (f"state output '{state.output_name}'", state.output_name, state.datatype, outputs)
        )
    for what, name, datatype, graph in wanted:
        found = graph.get(name)
        side = "inputs" if graph is inputs else "outputs"
        if found is None:
            return f"sequence_batching {what} is not among the ONNX graph's {side} {sorted(graph)}"
        if found != datatype:
            return f"sequence_batching {what} is {datatype} but the ONNX graph has {found}"
    return None
