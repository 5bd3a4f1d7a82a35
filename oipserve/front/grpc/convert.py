"""Protobuf request pieces as the data plane's types: tensors, versions, parameters.

Only what the gRPC wire format decides lives here (which ``contents`` field a
datatype uses, raw entries matched to inputs by position, the shared-memory
parameters' protobuf types); checks that hold for every surface are the data
plane's.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from functools import partial
from typing import Any, Final

from oipserve.errors import InvalidInput
from oipserve.grpc_generated import grpc_service_pb2 as pb
from oipserve.request.client_regions import ClientRegions, RegionUse
from oipserve.request.inference import InputTensor
from oipserve.request.region_parameters import PARAMETERS, RegionRequest, region_parameters
from oipserve.request.tensors import Deferred, check_datatype
from oipserve.wire.datatypes import DATATYPES
from oipserve.wire.shm import Lease

#: Which ``InferTensorContents`` field carries the typed values of each datatype.
CONTENTS_FIELD: Final[dict[str, str]] = {
    name: row.grpc_contents for name, row in DATATYPES.items() if row.grpc_contents
}
_ALL_CONTENTS: Final = sorted(set(CONTENTS_FIELD.values()))


def region_request(where: str, parameters: Any) -> RegionRequest | None:
    """A tensor's shared-memory parameters (``string_param`` / ``int64_param``), checked."""
    if not parameters or not any(key in parameters for key in PARAMETERS):
        return None  # PERF: most tensors have no parameters at all
    values = {}
    for key in PARAMETERS:
        if key in parameters:
            param = parameters[key]
            choice = param.WhichOneof("parameter_choice")
            values[key] = getattr(param, choice) if choice is not None else None
    return region_parameters(where, values)


def input_tensors(
    message: pb.ModelInferRequest,
    raw: Sequence[memoryview | bytes],
    regions: ClientRegions,
    owned: list[Lease | RegionUse],
    located: Sequence[tuple[Lease, int, int]] | None = None,
) -> list[InputTensor]:
    """InputTensors of a request: raw entries by position, typed ``contents``, or regions.

    Inputs in a client's shared-memory region have no raw entry (tritonclient sends
    raw entries for the other inputs only, in order). Each region held goes in ``owned``.
    ``located``: where each raw entry lies in a pooled segment, when the message was
    received into one; those inputs are not copied again.
    """
    # PERF: every read of a protobuf field makes an object (a str, a wrapper, a list):
    #   each input's fields are read once, here, and the checks below use what was read.
    read = _read_inputs(message)
    carried = 0
    for entry in read:
        if entry[4] is None:
            carried += 1
    if raw:
        for entry in read:
            if entry[0].HasField("contents"):
                raise InvalidInput(
                    "contents field must not be specified when using raw_input_contents for "
                    f"'{entry[1]}' for model '{message.model_name}'"
                )
        if len(raw) != carried:
            raise InvalidInput(
                f"the request has {carried} input(s) not in shared memory but {len(raw)} "
                "raw_input_contents entries; give exactly one per input, in the same order"
            )
    tensors: list[InputTensor] = []
    taken = 0  # raw entries used so far
    for tensor, name, datatype, shape, region in read:
        check_datatype(name, datatype)
        if region is not None:
            if tensor.HasField("contents"):
                raise InvalidInput(
                    f"input '{name}' names a shared memory region, so it must not carry contents"
                )
            use = regions.use(region, f"input '{name}'")
            owned.append(use)
            tensors.append(InputTensor(name, datatype, shape, region=use))
            continue
        if raw:
            if located is not None:
                tensors.append(InputTensor(name, datatype, shape, located=located[taken]))
            else:
                tensors.append(InputTensor(name, datatype, shape, raw=raw[taken]))
            taken += 1
            continue
        contents = typed_contents(tensor)
        # NOTE: converted by the data plane once the shape is checked (Deferred).
        values = Deferred(partial(list, contents), len(contents), exact=True)
        tensors.append(InputTensor(name, datatype, shape, values=values))
    return tensors


#: One input as ``_read_inputs`` read it: the message, name, datatype, shape and the
#: shared-memory region it names (None: none).
_Read = tuple[Any, str, str, list[int], RegionRequest | None]


def _read_inputs(message: pb.ModelInferRequest) -> list[_Read]:
    """Each input's fields, read once; its region parameters checked (in input order)."""
    read: list[_Read] = []
    inputs = message.inputs
    for index in range(len(inputs)):
        tensor = inputs[index]
        name = tensor.name
        parameters = tensor.parameters
        region = region_request(f"input '{name}'", parameters) if parameters else None
        read.append((tensor, name, tensor.datatype, list(tensor.shape), region))
    return read


def typed_contents(tensor: pb.ModelInferRequest.InferInputTensor) -> Collection[object]:
    """The repeated field holding the flat values of an input sent as typed ``contents``."""
    field = CONTENTS_FIELD.get(tensor.datatype)
    contents = tensor.contents
    if field is None:
        raise InvalidInput(
            f"input '{tensor.name}' has datatype {tensor.datatype}, which has no typed "
            "contents field; send it in raw_input_contents"
        )
    values = getattr(contents, field)
    if not values:
        for other in _ALL_CONTENTS:
            if other != field and len(getattr(contents, other)):
                raise InvalidInput(
                    f"input '{tensor.name}' has datatype {tensor.datatype}, so its contents "
                    f"must be in '{field}', not '{other}'"
                )
    return values


def class_count(output: pb.ModelInferRequest.InferRequestedOutputTensor) -> int:
    """An output's ``classification`` parameter (``int64_param`` > 0); 0 when not asked for."""
    parameters = output.parameters
    if not parameters or "classification" not in parameters:
        return 0
    param = parameters["classification"]
    if param.WhichOneof("parameter_choice") != "int64_param" or param.int64_param <= 0:
        raise InvalidInput(
            f"parameter 'classification' of output '{output.name}' must be a positive int64_param"
        )
    return param.int64_param


def requested_version(text: str) -> str | None:
    """A request's ``model_version``: protobuf's empty string means "the default version"."""
    return text or None


def repository_parameter(parameter: pb.ModelRepositoryParameter) -> object:
    """The Python value of a load/unload parameter (``bytes_param`` stays bytes)."""
    choice = parameter.WhichOneof("parameter_choice")
    return getattr(parameter, choice) if choice is not None else None


def schedule_parameters(parameters: Any) -> tuple[int, int]:
    """``priority`` and ``timeout`` (µs) of a ModelInferRequest; 0 when absent.

    The types Triton accepts: priority as ``uint64_param`` (tritonclient's) or a
    non-negative ``int64_param``; timeout as ``int64_param`` only, with Triton's message.
    """
    priority = timeout = 0
    if "priority" in parameters:
        param = parameters["priority"]
        kind = param.WhichOneof("parameter_choice")
        if kind == "uint64_param":
            priority = param.uint64_param
        elif kind == "int64_param" and param.int64_param >= 0:
            priority = param.int64_param
        else:
            raise InvalidInput(
                "invalid value type for 'priority' parameter, expected a non-negative "
                "int64_param or uint64_param."
            )
    if "timeout" in parameters:
        param = parameters["timeout"]
        if param.WhichOneof("parameter_choice") != "int64_param":
            raise InvalidInput("invalid value type for 'timeout' parameter, expected int64_param.")
        # NOTE: a negative one is accepted, as Triton does (it reads the bits as a uint64:
        #   a timeout beyond any other); 0 here is none. It was refused as the wrong type.
        timeout = max(0, param.int64_param)
    return priority, timeout


#: Request parameters with a meaning of their own, checked where they are read
#: (``schedule_parameters``, ``request.sequence_params.from_grpc``).
_READ_ELSEWHERE: Final = frozenset(
    {"priority", "timeout", "sequence_id", "sequence_start", "sequence_end"}
)
#: The ``triton_`` parameters Triton allows a request (its TRITON_RESERVED_REQUEST_PARAMS).
_TRITON_RESERVED: Final = ("triton_enable_empty_final_response",)
#: The types Triton takes for any other parameter (passed on to the model).
_CUSTOM_KINDS: Final = frozenset({"int64_param", "bool_param", "string_param", "double_param"})


def check_request_parameters(parameters: Any) -> None:
    """Triton's rules for the other parameters of a ModelInferRequest, whatever the
    model: a ``triton_`` key only if Triton reserves it (a bool), any other key an int64,
    bool, string or double. They were accepted here whatever they held (found by fuzzing).
    """
    for key, param in parameters.items():
        if key in _READ_ELSEWHERE:
            continue
        kind = param.WhichOneof("parameter_choice")
        if key.startswith("triton_"):
            if key not in _TRITON_RESERVED:
                raise InvalidInput(
                    "parameter keys starting with 'triton_' are reserved for Triton usage. "
                    "Only the following keys starting with 'triton_' are allowed: "
                    + " ".join(_TRITON_RESERVED)
                )
            if kind != "bool_param":
                raise InvalidInput(
                    f"invalid value type for '{key}' parameter, expected bool_param."
                )
        elif kind not in _CUSTOM_KINDS:
            raise InvalidInput(
                f"invalid value type for '{key}' parameter, expected int64_param, bool_param, "
                "or string_param."
            )
