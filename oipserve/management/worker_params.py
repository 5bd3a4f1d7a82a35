"""Reading the parameters of ``POST /v2/workers/{worker}/load``.

Everything here only checks and converts what the client sent; nothing is created.
``parse_load_request`` runs the checks that need no server state; the bounds that need the
node's inventory are in ``load_limits``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from oipserve.errors import InvalidInput
from oipserve.management.endpoint_naming import ParamKey, param_key

#: Worker kinds a client may load; the worker name in the URL is the kind.
KINDS = ("echo", "onnxruntime")
#: Worker-load parameters that become CUDA provider options.
CUDA_KEYS = (
    "gpu_mem_limit",
    "arena_extend_strategy",
    "cudnn_conv_algo_search",
    "do_copy_in_default_stream",
)


@dataclass(frozen=True)
class LoadRequest:
    """A worker-load request whose worker kind, parameter types and ``share`` are valid."""

    #: The worker name, lower-cased; it is also the kind and the endpoints' base name.
    worker: str
    #: Parameters as the client sent them (``share`` included), kept for ``endpoint_info``.
    params: Mapping[str, object]
    #: The typed identity of ``params``; see ``endpoint_naming.param_key``.
    key: ParamKey
    #: False asks for one more instance of an existing endpoint with the same parameters.
    share: bool


def parse_load_request(worker: str, params: Mapping[str, object]) -> LoadRequest:
    """Validate what can be validated without server state; 400 on any problem."""
    worker = worker.lower()
    if worker not in KINDS:
        raise InvalidInput(f"unknown worker '{worker}' (known workers: {', '.join(KINDS)})")
    key = param_key(worker, params)
    share = params.get("share", True)
    if not isinstance(share, bool):
        raise InvalidInput(f"parameter 'share' must be true or false; got {share!r}")
    return LoadRequest(worker, dict(params), key, share)


def positive_int(params: Mapping[str, object], name: str, default: int | None) -> int | None:
    """Parameter ``name`` as a positive integer, ``default`` when absent; 400 otherwise."""
    value = params.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInput(f"parameter '{name}' must be a positive integer; got {value!r}")
    return value


def optional_str(params: Mapping[str, object], name: str) -> str | None:
    """Parameter ``name`` as a string (integers accepted, e.g. ``version: 2``); 400 otherwise."""
    value = params.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise InvalidInput(f"parameter '{name}' must be a string; got {value!r}")
    return str(value)


def cuda_settings(params: Mapping[str, object]) -> dict[str, str]:
    """The CUDA provider options among ``params``, as the strings ONNX Runtime expects.

    Booleans become "1"/"0"; the values are only converted here, and validated by
    ``hardware.cuda_provider_options``.
    """
    settings: dict[str, str] = {}
    for name in CUDA_KEYS:
        if name in params:
            value = params[name]
            settings[name] = ("1" if value else "0") if isinstance(value, bool) else str(value)
    return settings
