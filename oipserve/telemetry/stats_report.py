"""The statistics extension: which versions a request names, in Triton's JSON shape.

``GET /v2/models[/{name}[/versions/{v}]]/stats`` and gRPC ``ModelStatistics``
both answer ``model_statistics``; gRPC parses the same dict into its protobuf
message, so the two surfaces cannot drift apart. Only READY versions are
listed. Unlike Triton (400 for everything), an unknown model or version is
404 / NOT_FOUND and a known one without a ready version 503 / UNAVAILABLE,
as every other model route of this server answers (docs/metrics.md).
"""

from __future__ import annotations

from oipserve.errors import NotFound, Unavailable
from oipserve.models.registry import ModelRegistry, ModelVersion, check_version, unknown_model
from oipserve.telemetry.stats import ModelStats, StatsRegistry


def model_statistics(
    stats: StatsRegistry, models: ModelRegistry, name: str | None, version: str | None
) -> dict[str, object]:
    """``{"model_stats": [...]}``: every ready version of all models, of one, or one version."""
    return {"model_stats": [model_stat(s) for _, s in select(stats, models, name, version)]}


def select(
    stats: StatsRegistry, models: ModelRegistry, name: str | None, version: str | None
) -> list[tuple[ModelVersion, ModelStats]]:
    """The (version, statistics) pairs a request names; NotFound / Unavailable otherwise."""
    if not name:
        return list(stats.ready())
    versions = models.models.get(name)
    if versions is None:
        models.resolve(name, None)  # raises what every model route answers for it
        raise unknown_model(name)
    if version is not None:
        # (an empty one too: 400, as every model route; it listed every version)
        version = check_version(version)
        model = versions.get(version)
        if model is None:
            raise NotFound(
                f"model '{name}' has no version '{version}' (versions: {', '.join(versions)})"
            )
        if model.state != "READY":
            raise Unavailable(f"model '{name}' version {version} is not ready")
        return [(model, stats.totals(model))]
    found = list(stats.ready(name))
    if not found:
        raise Unavailable(f"model '{name}' has no ready version")
    return found


def _duration(count: int, ns: int) -> dict[str, int]:
    return {"count": count, "ns": ns}


def model_stat(stats: ModelStats) -> dict[str, object]:
    """One version's entry, with every key Triton sends, in Triton's order."""
    done = stats.success_count
    # NOTE: a cache hit is a success whose queue counts (0 ns) and that has no compute
    #   phases (Triton's grpc_service.proto: queue includes cache hits, compute_* do not).
    ran = done - stats.cache_hit_count
    return {
        "name": stats.name,
        "version": stats.version,
        "last_inference": stats.last_inference_ms,
        "inference_count": stats.inference_count,
        "execution_count": stats.execution_count,
        "inference_stats": {
            "success": _duration(done, stats.success_ns),
            "fail": _duration(stats.fail_count, stats.fail_ns),
            "queue": _duration(done, stats.queue_ns),
            "compute_input": _duration(ran, stats.input_ns),
            "compute_infer": _duration(ran, stats.infer_ns),
            "compute_output": _duration(ran, stats.output_ns),
            # Zeros when the version's cache is off, as Triton reports them.
            "cache_hit": _duration(stats.cache_hit_count, stats.cache_hit_ns),
            "cache_miss": _duration(stats.cache_miss_count, stats.cache_miss_ns),
        },
        # Empty for models that are not decoupled, which is every model here.
        "response_stats": {},
        "batch_stats": [
            {
                "batch_size": size,
                "compute_input": _duration(row.executions, row.input_ns),
                "compute_infer": _duration(row.executions, row.infer_ns),
                "compute_output": _duration(row.executions, row.output_ns),
            }
            for size, row in sorted(stats.batches.items())
        ],
        "memory_usage": [],
    }
