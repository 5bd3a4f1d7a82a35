"""The handlers of GRPCInferenceService over the DataPlane (``InferenceService``).

Each handler takes the parsed request (ModelInfer: an ``InferCall`` from
``codec``), converts it (``convert``), calls the data plane or ``Management``
and builds the response; failures are raised as ``ServerError``s and become
statuses in ``handlers`` / ``status``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from google.protobuf import json_format

from oipserve.dataplane.plane import DataPlane
from oipserve.errors import InvalidInput
from oipserve.front.grpc.codec import InferCall, InferReply
from oipserve.front.grpc.convert import (
    check_request_parameters,
    class_count,
    input_tensors,
    region_request,
    repository_parameter,
    requested_version,
    schedule_parameters,
)
from oipserve.grpc_generated import grpc_service_pb2 as pb
from oipserve.grpc_generated import health_pb2 as health
from oipserve.request import sequence_params
from oipserve.request.checks import output_twice
from oipserve.request.client_regions import RegionUse
from oipserve.request.inference import Inference
from oipserve.request.sequence_params import takes_sequence
from oipserve.telemetry.stats_report import model_statistics
from oipserve.wire.shm import Lease

if TYPE_CHECKING:  # the other HTTP fronts answer ModelInfer here without the manager
    from oipserve.management import Management


class InferenceService:
    """Handlers of GRPCInferenceService; anything not listed answers UNIMPLEMENTED."""

    def __init__(self, dataplane: DataPlane, management: Management | None = None) -> None:
        self.dataplane = dataplane
        #: The model repository extension; without it those RPCs answer UNIMPLEMENTED.
        self.management = management

    async def ServerLive(self, request: pb.ServerLiveRequest) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self.dataplane.live())

    async def ServerReady(self, request: pb.ServerReadyRequest) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.dataplane.ready())

    async def Check(self, request: health.HealthCheckRequest) -> health.HealthCheckResponse:
        """gRPC's standard health check, as Triton answers it: SERVING while the server is
        ready (``ServerReady``), NOT_SERVING otherwise; the service named is not looked at."""
        ready = self.dataplane.ready()
        status = (
            health.HealthCheckResponse.SERVING if ready else health.HealthCheckResponse.NOT_SERVING
        )
        return health.HealthCheckResponse(status=status)

    async def ModelReady(self, request: pb.ModelReadyRequest) -> pb.ModelReadyResponse:
        ready = self.dataplane.registry.model_ready(
            request.name, requested_version(request.version)
        )
        return pb.ModelReadyResponse(ready=ready)

    async def ServerMetadata(self, request: pb.ServerMetadataRequest) -> pb.ServerMetadataResponse:
        meta = self.dataplane.server_metadata()
        return json_format.ParseDict(meta, pb.ServerMetadataResponse(), ignore_unknown_fields=True)

    async def ModelMetadata(self, request: pb.ModelMetadataRequest) -> pb.ModelMetadataResponse:
        meta = self.dataplane.model_metadata(request.name, requested_version(request.version))
        return json_format.ParseDict(meta, pb.ModelMetadataResponse(), ignore_unknown_fields=True)

    async def ModelConfig(self, request: pb.ModelConfigRequest) -> pb.ModelConfigResponse:
        version = requested_version(request.version)
        message = self.dataplane.model_config_message(request.name, version)
        return pb.ModelConfigResponse(config=message)

    async def ModelStatistics(
        self, request: pb.ModelStatisticsRequest
    ) -> pb.ModelStatisticsResponse:
        """The statistics extension: the same dict as REST's, parsed into the protobuf."""
        dataplane = self.dataplane
        await dataplane.stats.refresh()
        report = model_statistics(
            dataplane.stats, dataplane.registry, request.name or None, request.version or None
        )
        return json_format.ParseDict(report, pb.ModelStatisticsResponse())

    async def RepositoryIndex(
        self, request: pb.RepositoryIndexRequest
    ) -> pb.RepositoryIndexResponse:
        if self.management is None:
            raise RuntimeError("RepositoryIndex reached a front without model management")
        self.management.check_repository_name(request.repository_name)
        response = pb.RepositoryIndexResponse()
        for entry in self.management.index(request.ready):
            response.models.add(
                name=entry["name"],
                version=entry.get("version", ""),
                state=entry.get("state", ""),
                reason=entry.get("reason", ""),
            )
        return response

    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest
    ) -> pb.RepositoryModelLoadResponse:
        if self.management is None:
            raise RuntimeError("RepositoryModelLoad reached a front without model management")
        self.management.check_repository_name(request.repository_name)
        parameters = {k: repository_parameter(v) for k, v in request.parameters.items()}
        await self.management.repository_load(
            request.model_name, None, parameters, files_in_base64=False
        )
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest
    ) -> pb.RepositoryModelUnloadResponse:
        if self.management is None:
            raise RuntimeError("RepositoryModelUnload reached a front without model management")
        self.management.check_repository_name(request.repository_name)
        parameters = {k: repository_parameter(v) for k, v in request.parameters.items()}
        await self.management.repository_unload(request.model_name, None, parameters)
        return pb.RepositoryModelUnloadResponse()

    # ---- the system shared-memory extension (oipserve.request.client_regions) --------------

    async def SystemSharedMemoryStatus(
        self, request: pb.SystemSharedMemoryStatusRequest
    ) -> pb.SystemSharedMemoryStatusResponse:
        response = pb.SystemSharedMemoryStatusResponse()
        for entry in self.dataplane.regions.status(request.name or None):
            response.regions[entry["name"]].CopyFrom(
                pb.SystemSharedMemoryStatusResponse.RegionStatus(**entry)
            )
        return response

    async def SystemSharedMemoryRegister(
        self, request: pb.SystemSharedMemoryRegisterRequest
    ) -> pb.SystemSharedMemoryRegisterResponse:
        await self.dataplane.regions.register(
            request.name, request.key, request.offset, request.byte_size
        )
        return pb.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(
        self, request: pb.SystemSharedMemoryUnregisterRequest
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        await self.dataplane.regions.unregister(request.name or None)
        return pb.SystemSharedMemoryUnregisterResponse()

    async def CudaSharedMemoryStatus(
        self, request: pb.CudaSharedMemoryStatusRequest
    ) -> pb.CudaSharedMemoryStatusResponse:
        self.dataplane.regions.cuda_status(request.name or None)  # nothing, or NotFound
        return pb.CudaSharedMemoryStatusResponse()

    async def CudaSharedMemoryRegister(self, request: object) -> object:
        self.dataplane.regions.check_allowed()  # the flag first, as Triton (and REST)
        raise InvalidInput(self.dataplane.regions.cuda_refusal)

    async def CudaSharedMemoryUnregister(
        self, request: pb.CudaSharedMemoryUnregisterRequest
    ) -> pb.CudaSharedMemoryUnregisterResponse:
        self.dataplane.regions.check_allowed()  # refused while the flag is off (Triton's rule)
        return pb.CudaSharedMemoryUnregisterResponse()  # no CUDA region is ever registered

    async def ModelInfer(self, call: InferCall) -> InferReply:
        message = call.message
        regions = self.dataplane.regions
        # NOTE: a message received into a lease (front.grpc.call) hands it over here; the data
        #   plane releases it once the worker has read the inputs, as a REST body's.
        owned: list[Lease | RegionUse] = [call.lease] if call.lease is not None else []
        into_regions: dict[str, RegionUse] = {}
        try:
            version = requested_version(message.model_version)
            model = self.dataplane.resolve(message.model_name, version)
        except Exception:
            for held in owned:
                held.release()
            raise
        try:
            inputs = input_tensors(message, call.raw, regions, owned, call.located())
            outputs = []
            classes: dict[str, int] = {}  # outputs wanted as their top-k classes: k
            for output in message.outputs:
                where = f"output '{output.name}'"
                wanted = region_request(where, output.parameters)
                if wanted is not None:
                    if output.name in into_regions:
                        raise output_twice(inputs, output.name, message.id)
                    into_regions[output.name] = regions.use(wanted, where)
                outputs.append(output.name)
                count = class_count(output)
                if count:
                    classes[output.name] = count
            parameters = message.parameters
            priority, timeout_us = schedule_parameters(parameters)
            # a sequence model, or an ensemble with one as a step
            sequence = sequence_params.from_grpc(parameters) if takes_sequence(model) else None
            if parameters:
                check_request_parameters(parameters)
                if sequence is None:  # checked all the same, as Triton checks them
                    sequence_params.from_grpc(parameters)
        except Exception as exc:
            for held in [*owned, *into_regions.values()]:
                held.release()
            self.dataplane.refused(model, exc)
            raise
        # NOTE: a client that cancels or goes away cancels this call's task, which
        #   withdraws a request still queued in a dynamic batcher.
        request_id = message.id  # (each read of a protobuf string field is a new str)
        inference = Inference(
            model, inputs, outputs, owned, priority=priority, timeout_us=timeout_us,
            into_regions=into_regions, classification=classes, request_id=request_id,
        )  # fmt: skip
        inference.sequence = sequence
        inference.deadline = call.deadline
        inference.parked = call.parked
        result = await self.dataplane.infer(inference)
        return InferReply(result, request_id)
