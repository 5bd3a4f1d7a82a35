"""Which calls a front answers on its own HTTP/2: its method table, built once."""

from __future__ import annotations

from oipserve.config.settings import Settings
from oipserve.dataplane.plane import DataPlane
from oipserve.front.grpc.call_table import Answers, CallTable, Forward
from oipserve.front.grpc.handlers import stream_infer, unary_methods
from oipserve.front.grpc.service import InferenceService

#: What another HTTP front answers itself; it forwards the rest (and streams run here).
ANSWERED_BY_EVERY_FRONT = ("ModelInfer", "ServerLive")


def in_front_table(
    settings: Settings,
    service: InferenceService,
    dataplane: DataPlane,
    forward: Forward | None = None,
    answers: Answers | None = None,
) -> CallTable:
    """The calls a front answers on its own HTTP/2: every RPC (the primary), or, with
    ``forward``, ModelInfer, ModelStreamInfer and ServerLive (another HTTP front) for the
    models it ``answers``."""
    methods = unary_methods(service)
    if forward is not None:
        methods = {name: methods[name] for name in ANSWERED_BY_EVERY_FRONT}
    return CallTable(
        settings,
        methods,
        stream_infer(service),
        dataplane.inputs,
        forward,
        answers,
    )
