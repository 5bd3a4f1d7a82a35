"""Management plane: hardware queries, worker endpoints (AMD semantics), model repository.

Framework-free: ``oipserve.front.rest.admin`` and ``oipserve.front.grpc.service`` turn
requests into calls on ``Management``, and errors are ``oipserve.errors`` classes. One
module per job:

- ``facade``: ``Management``, and where the jobs meet (one namespace, no global lock);
- ``hardware_view``: ``/v2/hardware`` (inventory read afresh; 503 if unreadable);
- ``worker_params``: checking and converting ``/v2/workers/{w}/load`` parameters;
- ``endpoint_naming``: amdinfer's typed parameter keys and ``W``/``W-0`` naming;
- ``load_limits``: bounds on every number a load may ask for, and the load timeout;
- ``endpoint_plan``: a new endpoint checked against the node, limits and repository;
- ``endpoint_sessions``: endpoint sessions on workers, and the workers started for them;
- ``worker_endpoints``: the endpoint table: creating, growing, shrinking, describing;
- ``repository_control``: repository index/load/unload and the models loaded at start;
- ``load_override``: a repository load's ``config`` and ``file:`` parameters.

The names below are the package's interface; import them from here.
"""

from oipserve.management.endpoint_naming import EndpointNames, ParamKey, param_key
from oipserve.management.facade import Management
from oipserve.management.load_limits import LoadLimits
from oipserve.management.repository_control import startup_models
from oipserve.management.worker_endpoints import Endpoint
from oipserve.management.worker_params import CUDA_KEYS, KINDS

__all__ = [
    "CUDA_KEYS",
    "KINDS",
    "LoadLimits",
    "Endpoint",
    "EndpointNames",
    "Management",
    "ParamKey",
    "param_key",
    "startup_models",
]
