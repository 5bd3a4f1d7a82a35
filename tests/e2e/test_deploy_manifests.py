"""deploy/: every manifest is checked against what KServe accepts, then RUN.

Each ClusterServingRuntime, the plain Deployment and the Containerfiles are read (PyYAML),
checked against the fields KServe's CRDs and Kubernetes accept (the small schema below,
with its sources), and then their own container command line is started as a local
process against a test repository standing in for /mnt/models: the same args, with only
the model directory and the port numbers (0: free ports) swapped in. Their own readiness,
liveness and startup probe paths and ports, and their metrics annotation, are then probed
on the ports the server reports. The InferenceServices are checked against the runtime
they name, and their declared ports probed on that runtime's running server. A manifest
that drifts from the CLI (a renamed flag, a probe on the wrong port or path, a metrics
port the server does not serve) fails here. Each runtime's args also run on what KServe's
storage initializer leaves at /mnt/models for a bucket of one model (a bare model.onnx,
with and without config.pbtxt; a one-model Triton repository whose directory has another
name), and the model is inferred as the InferenceService's name with tritonclient.
deploy/place-worker.sh is run against a server with a fake two-GPU inventory.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as grpcclient
import yaml

from hardware.cpus import instances_for, usable_cpus
from oipserve.config.settings import Settings, load_settings
from tests.support.deploy import (
    KSERVE_TRITONSERVER_ARGS,
    fingerprint,
    infer_simple_grpc,
    infer_simple_http,
    read_only,
    rest_over_h2c,
    write_kserve_layout,
)
from tests.support.server import ROOT, SAMPLE_REPOSITORY, ServerProcess

DEPLOY = ROOT / "deploy"
KSERVE = DEPLOY / "kserve"

# ---- what KServe and Kubernetes accept (the schema) -----------------------------------
# kserve/kserve pkg/apis/serving/v1alpha1/servingruntime_types.go: ServingRuntimeSpec with
# the inlined ServingRuntimePodSpec, and SupportedModelFormat.
RUNTIME_SPEC_FIELDS = {
    "supportedModelFormats", "multiModel", "disabled", "protocolVersions", "workerSpec",
    "containers", "volumes", "nodeSelector", "affinity", "tolerations", "labels",
    "annotations", "imagePullSecrets", "hostIPC", "grpcEndpoint", "grpcDataEndpoint",
    "httpDataEndpoint", "replicas", "storageHelper", "builtInAdapter",
}  # fmt: skip
MODEL_FORMAT_FIELDS = {"name", "version", "autoSelect", "priority"}
# kserve pkg/constants/constants.go: InferenceServiceProtocol values.
PROTOCOLS = {"v1", "v2", "grpc-v1", "grpc-v2"}
# constants.go: InferenceServiceContainerName, DefaultModelLocalMountPath,
# InferenceServiceDefaultHttpPort (the port KServe assumes when a container declares none).
KSERVE_CONTAINER = "kserve-container"
KSERVE_MODEL_DIR = "/mnt/models"
KSERVE_DEFAULT_PORT = 8080
# Kubernetes core/v1 Container, Probe, HTTPGetAction, ContainerPort.
CONTAINER_FIELDS = {
    "name", "image", "command", "args", "workingDir", "ports", "envFrom", "env", "resources",
    "resizePolicy", "restartPolicy", "volumeMounts", "volumeDevices", "livenessProbe",
    "readinessProbe", "startupProbe", "lifecycle", "terminationMessagePath",
    "terminationMessagePolicy", "imagePullPolicy", "securityContext", "stdin", "stdinOnce",
    "tty",
}  # fmt: skip
PROBE_FIELDS = {
    "httpGet", "tcpSocket", "grpc", "exec", "initialDelaySeconds", "timeoutSeconds",
    "periodSeconds", "successThreshold", "failureThreshold", "terminationGracePeriodSeconds",
}  # fmt: skip
HTTP_GET_FIELDS = {"path", "port", "host", "scheme", "httpHeaders"}
PORT_FIELDS = {"name", "containerPort", "protocol", "hostPort", "hostIP"}
# kserve pkg/apis/serving/v1beta1/predictor.go (PredictorSpec: framework keys, model,
# workerSpec, inlined PodSpec and ComponentExtensionSpec from component.go).
PREDICTOR_FIELDS = {
    "sklearn", "xgboost", "tensorflow", "pytorch", "triton", "onnx", "huggingface", "pmml",
    "lightgbm", "paddle", "model", "workerSpec",
    # ComponentExtensionSpec
    "minReplicas", "maxReplicas", "scaleTarget", "scaleMetric", "scaleMetricType",
    "autoScaling", "containerConcurrency", "timeout", "canaryTrafficPercent", "logger",
    "batcher", "labels", "annotations", "deploymentStrategy",
    # PodSpec (core/v1, as inlined by KServe's v1beta1 PodSpec)
    "volumes", "initContainers", "containers", "ephemeralContainers", "restartPolicy",
    "terminationGracePeriodSeconds", "activeDeadlineSeconds", "dnsPolicy", "nodeSelector",
    "serviceAccountName", "serviceAccount", "automountServiceAccountToken", "nodeName",
    "hostNetwork", "hostPID", "hostIPC", "shareProcessNamespace", "securityContext",
    "imagePullSecrets", "hostname", "subdomain", "affinity", "schedulerName", "tolerations",
    "hostAliases", "priorityClassName", "priority", "dnsConfig", "readinessGates",
    "runtimeClassName", "enableServiceLinks", "preemptionPolicy", "overhead",
    "topologySpreadConstraints", "setHostnameAsFQDN", "os", "hostUsers", "schedulingGates",
    "resourceClaims",
}  # fmt: skip
# predictor_model.go ModelSpec + predictor.go PredictorExtensionSpec (+ inlined Container).
MODEL_SPEC_FIELDS = {
    "modelFormat", "runtime", "storageUri", "runtimeVersion", "protocolVersion", "storage",
} | CONTAINER_FIELDS - {"name"}  # fmt: skip
# serving.kserve.io/deploymentMode values (constants.go DeploymentModeType).
DEPLOYMENT_MODES = {"Serverless", "RawDeployment", "ModelMesh"}
STORAGE_SCHEMES = ("gs://", "s3://", "pvc://", "hdfs://", "webhdfs://", "https://", "oci://")
HEALTH_READY = "/v2/health/ready"
HEALTH_LIVE = "/v2/health/live"
PORT_FLAGS = {
    "http_port": "--http-port",
    "grpc_port": "--grpc-port",
    "metrics_port": "--metrics-port",
}


def load(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def runtimes() -> dict[str, dict[str, Any]]:
    found = {}
    for path in sorted(KSERVE.glob("*.yaml")):
        for doc in load(path):
            if doc["kind"] in ("ClusterServingRuntime", "ServingRuntime"):
                found[doc["metadata"]["name"]] = doc
    return found


def inference_services() -> list[tuple[Path, dict[str, Any]]]:
    return [
        (path, doc)
        for path in sorted(KSERVE.glob("*.yaml"))
        for doc in load(path)
        if doc["kind"] == "InferenceService"
    ]


def only_known(where: str, given: Mapping[str, Any], known: set[str]) -> None:
    unknown = set(given) - known
    assert not unknown, f"{where}: fields KServe/Kubernetes do not define: {sorted(unknown)}"


# ---- KServe's templating of container args ({{.Name}}, {{.Labels.x}}, ...) ----------------
TEMPLATE = re.compile(r"\{\{\s*\.(\w+)(?:\.([\w./-]+))?\s*\}\}")


def render(text: str, meta: Mapping[str, Any]) -> str:
    """KServe's ReplacePlaceholders: Go templates over the InferenceService ObjectMeta."""

    def value(match: re.Match[str]) -> str:
        field, key = match.group(1), match.group(2)
        if key is None:
            return str(meta[field[0].lower() + field[1:]])
        return str(meta[field[0].lower() + field[1:]][key])

    return TEMPLATE.sub(value, text)


ISVC_META = {"name": "densenet-onnx", "namespace": "models", "labels": {}, "annotations": {}}


# ---- the container command line, localised ---------------------------------------------
@dataclass
class Launch:
    """A container's command line as this machine runs it."""

    argv: list[str]  # after `oipserve`
    env: dict[str, str]
    settings: Settings  # what the manifest's own args mean (ports as declared)


def localise(argv: Sequence[str], env: Mapping[str, str], model_dir: str, repo: Path) -> Launch:
    """The manifest's args, exactly, except the model directory and 0 for each port."""
    _, declared = load_settings(argv, env)
    assert declared.model_repository.rstrip("/") == model_dir, (declared, model_dir)
    out: list[str] = []
    given: set[str] = set()
    skip = False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        flag = arg.split("=", 1)[0]
        if flag in PORT_FLAGS.values():
            given.add(flag)
            out.append(f"{flag}=0")
            skip = "=" not in arg
            continue
        out.append(arg.replace(model_dir, str(repo)) if i else arg)
    local_env = {k: v.replace(model_dir, str(repo)) for k, v in env.items()}
    for name, flag in PORT_FLAGS.items():
        if flag not in given:
            local_env[f"OIPSERVE_{name.upper()}"] = "0"
    return Launch(out, local_env, declared)


@dataclass
class Running:
    srv: ServerProcess
    ports: dict[int, int]  # declared port -> port on this machine
    settings: Settings

    def local(self, port: int | str, named: Mapping[str, int] | None = None) -> int:
        number = named[port] if isinstance(port, str) and named else port
        assert number in self.ports, f"port {port} is not one the server serves: {self.ports}"
        return self.ports[int(number)]


def start(launch: Launch) -> Running:
    srv = ServerProcess(argv=launch.argv, env=launch.env).wait_ready()
    ports: dict[int, int] = {}
    if launch.settings.allow_http:
        ports[launch.settings.http_port] = srv.port
    if launch.settings.allow_grpc:
        ports[launch.settings.grpc_port] = srv.grpc_port
    if launch.settings.allow_metrics:
        ports[launch.settings.metrics_port] = int(srv.metrics_url.rsplit(":", 1)[1])
    assert all(ports.values()), srv.ready_line
    return Running(srv, ports, launch.settings)


def get(port: int, path: str) -> tuple[int, bytes]:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def probe(running: Running, probe: Mapping[str, Any], named: Mapping[str, int]) -> str:
    """Run one Kubernetes probe (httpGet or tcpSocket) against the local server."""
    only_known("probe", probe, PROBE_FIELDS)
    if "httpGet" in probe:
        only_known("httpGet", probe["httpGet"], HTTP_GET_FIELDS)
        port = running.local(probe["httpGet"]["port"], named)
        status, body = get(port, probe["httpGet"]["path"])
        assert status == 200, (probe, status, body)
        return probe["httpGet"]["path"]
    raise AssertionError(f"unsupported probe {probe}")


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The test repository standing in for /mnt/models; it must come back unchanged."""
    root = tmp_path_factory.mktemp("mnt") / "models"
    for name in ("simple", "identity_fp32"):
        shutil.copytree(SAMPLE_REPOSITORY / name, root / name)
    read_only(root)
    before = fingerprint(root)
    yield root
    assert fingerprint(root) == before, "a server wrote into the model repository"


# ---- ClusterServingRuntimes ------------------------------------------------------------
def check_runtime_structure(runtime: dict[str, Any]) -> dict[str, Any]:
    name = runtime["metadata"]["name"]
    assert runtime["apiVersion"] == "serving.kserve.io/v1alpha1"
    spec = runtime["spec"]
    only_known(f"{name}.spec", spec, RUNTIME_SPEC_FIELDS)
    formats = spec["supportedModelFormats"]
    for fmt in formats:
        only_known(f"{name} model format", fmt, MODEL_FORMAT_FIELDS)
        assert isinstance(fmt.get("version", ""), str), "versions are strings"
        assert fmt.get("priority", 1) >= 1, "kubebuilder Minimum=1"
    assert {f["name"] for f in formats} >= {"onnx", "triton"}
    assert set(spec["protocolVersions"]) == {"v2", "grpc-v2"} <= PROTOCOLS
    (container,) = spec["containers"]
    assert container["name"] == KSERVE_CONTAINER
    only_known(f"{name} container", container, CONTAINER_FIELDS)
    # No ports: KServe assumes 8080 and a serverless InferenceService may add Knative's one.
    assert "ports" not in container
    assert "lifecycle" not in container, "Knative refuses lifecycle on the user container"
    for port in container.get("ports", []):
        only_known("port", port, PORT_FIELDS)
    # The InferenceService's name, so a bucket of one model answers as it (KServe's
    # ReplacePlaceholders fills {{.Name}} in args, as for its own sklearn and mlserver).
    assert "--model-name={{.Name}}" in container["args"]
    assert container["readinessProbe"]["httpGet"]["path"] == HEALTH_READY
    assert container["livenessProbe"]["httpGet"]["path"] == HEALTH_LIVE
    startup = container["startupProbe"]
    assert startup["httpGet"]["path"] == HEALTH_READY
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300, "big models load"
    security = container["securityContext"]
    assert security["runAsUser"] == 1000 and security["runAsNonRoot"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert container["resources"]["requests"] and container["resources"]["limits"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory", "tensors use /dev/shm"
    return container


@pytest.fixture(scope="module")
def running_runtimes(repo: Path) -> Iterator[dict[str, Running]]:
    started: dict[str, Running] = {}
    try:
        for name, runtime in runtimes().items():
            container = check_runtime_structure(runtime)
            args = [render(a, ISVC_META) for a in container["args"]]
            env = {e["name"]: render(e["value"], ISVC_META) for e in container.get("env", [])}
            started[name] = start(localise(args, env, KSERVE_MODEL_DIR, repo))
        yield started
    finally:
        for running in started.values():
            code = running.srv.stop()
            assert code == 0, running.srv.log
            assert "Traceback" not in running.srv.log, running.srv.log


def test_there_are_a_cpu_and_a_cuda_runtime() -> None:
    found = runtimes()
    assert set(found) == {"oipserve", "oipserve-cuda"}
    limits = found["oipserve-cuda"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "1"


@pytest.mark.parametrize("name", sorted(runtimes()))
def test_runtime_args_start_the_server_its_probes_and_metrics_describe(
    name: str, running_runtimes: dict[str, Running]
) -> None:
    runtime = runtimes()[name]
    container = runtime["spec"]["containers"][0]
    running = running_runtimes[name]
    settings = running.settings
    # Same ports as kserve-tritonserver: HTTP where KServe looks by default, gRPC on 9000.
    assert (settings.http_port, settings.grpc_port, settings.metrics_port) == (8080, 9000, 8002)
    assert settings.host == "0.0.0.0"
    for kind in ("readinessProbe", "livenessProbe", "startupProbe"):
        probe(running, container[kind], {})
    annotations = runtime["spec"]["annotations"]
    for key in ("prometheus.kserve.io", "prometheus.io"):
        port = running.local(int(annotations[f"{key}/port"]))
        status, body = get(port, annotations[f"{key}/path"])
        assert status == 200 and b"nv_inference_request_success" in body, (key, status)
    assert annotations["prometheus.io/scrape"] == "true"
    # gRPC on the declared gRPC port (what protocolVersions grpc-v2 promises).
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{running.local(settings.grpc_port)}")
    assert client.is_server_ready() and client.is_model_ready("simple")
    client.close()


@pytest.mark.parametrize("name", sorted(runtimes()))
def test_runtime_worker_instances_follow_the_auto_rule(
    name: str, running_runtimes: dict[str, Running]
) -> None:
    """Issue #40: the runtimes name --instances-per-device=auto, and the server starts what
    ``hardware.cpus.instances_for`` gives for the CPUs it may use, and says so."""
    running = running_runtimes[name]
    assert running.settings.instances_per_device is None  # auto
    count = instances_for("cpu", usable_cpus())  # this machine runs no GPU: both use the CPU
    assert f"--instances-per-device auto: {count} on cpu (" in running.srv.log
    status, body = get(running.local(running.settings.http_port), "/v2/hardware")
    assert status == 200
    sessions = [
        i for i in json.loads(body)["devices"]["cpu"]["instances"] if i["model"] == "simple"
    ]
    assert len(sessions) == count, sessions


@pytest.mark.parametrize("layout", ["bare", "bare-config", "single-dir"])
@pytest.mark.parametrize("name", sorted(runtimes()))
def test_runtime_args_serve_a_bucket_of_one_model_as_the_inference_service(
    name: str, layout: str, tmp_path: Path
) -> None:
    root = write_kserve_layout(tmp_path / "mnt" / "models", layout, "unused")
    read_only(root)
    before = fingerprint(root)
    container = check_runtime_structure(runtimes()[name])
    args = [render(a, ISVC_META) for a in container["args"]]
    env = {e["name"]: render(e["value"], ISVC_META) for e in container.get("env", [])}
    running = start(localise(args, env, KSERVE_MODEL_DIR, root))
    try:
        isvc = ISVC_META["name"]
        for kind in ("readinessProbe", "livenessProbe", "startupProbe"):
            probe(running, container[kind], {})
        # tritonclient posts to /v2/models/densenet-onnx/infer (and gRPC ModelInfer).
        http_port = running.local(running.settings.http_port)
        metadata = infer_simple_http(f"127.0.0.1:{http_port}", isvc)
        assert metadata["versions"] == ["1"]
        infer_simple_grpc(f"127.0.0.1:{running.local(running.settings.grpc_port)}", isvc)
    finally:
        assert running.srv.stop() == 0, running.srv.log
        assert "Traceback" not in running.srv.log, running.srv.log
    assert fingerprint(root) == before, "a server wrote into the model repository"


# ---- InferenceServices -----------------------------------------------------------------
@pytest.mark.parametrize("path", [p for p, _ in inference_services()], ids=lambda p: p.name)
def test_inference_service_fits_its_runtime_and_its_ports_answer(
    path: Path, running_runtimes: dict[str, Running]
) -> None:
    (isvc,) = [d for p, d in inference_services() if p == path]
    assert isvc["apiVersion"] == "serving.kserve.io/v1beta1"
    name = isvc["metadata"]["name"]
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name), "KServe's name rule"
    annotations = isvc["metadata"].get("annotations", {})
    mode = annotations["serving.kserve.io/deploymentMode"]
    assert mode in DEPLOYMENT_MODES
    assert annotations["serving.kserve.io/enable-prometheus-scraping"] == "true"
    predictor = isvc["spec"]["predictor"]
    only_known(f"{name}.spec.predictor", predictor, PREDICTOR_FIELDS)
    model = predictor["model"]
    only_known(f"{name} model", model, MODEL_SPEC_FIELDS)
    runtime = runtimes()[model["runtime"]]
    formats = {(f["name"], f.get("version")) for f in runtime["spec"]["supportedModelFormats"]}
    assert (model["modelFormat"]["name"], model["modelFormat"].get("version")) in formats
    assert model["protocolVersion"] in runtime["spec"]["protocolVersions"]
    assert model["storageUri"].startswith(STORAGE_SCHEMES)
    running = running_runtimes[model["runtime"]]
    ports = model.get("ports", [])
    for port in ports:
        only_known("port", port, PORT_FIELDS)
    if mode == "Serverless":
        assert len(ports) <= 1, "Knative routes exactly one container port"
        if model["protocolVersion"] == "grpc-v2":
            assert ports and ports[0]["name"] == "h2c", "Knative speaks HTTP/2 only to h2c"
        if ports:
            # The one routed port is the HTTP port: REST (HTTP/1.1 and HTTP/2) and gRPC
            # (h2c) on it, and the runtime's probes on the routed port.
            assert ports[0]["containerPort"] == running.settings.http_port
    served = [p["containerPort"] for p in ports] or [KSERVE_DEFAULT_PORT]
    h2c = {p["containerPort"] for p in ports if p.get("name") == "h2c"}
    grpc_port = running.settings.grpc_port
    # Raw mode: the first port is the Service's port 80, so it must be the HTTP port.
    if mode == "RawDeployment":
        assert served[0] == running.settings.http_port
    for number in served:
        local = running.local(number)
        if number in h2c:
            # Knative's queue-proxy speaks HTTP/2 with prior knowledge to an h2c port, for
            # REST requests as for gRPC calls: both are served there.
            rest_over_h2c(local, "simple")
            infer_simple_grpc(f"127.0.0.1:{local}", "simple")
        elif number == grpc_port:
            client = grpcclient.InferenceServerClient(f"127.0.0.1:{local}")
            assert client.is_server_ready()
            client.close()
        else:
            assert get(local, HEALTH_READY)[0] == 200
    if "nvidia.com/gpu" in model.get("resources", {}).get("limits", {}):
        assert model["runtime"] == "oipserve-cuda"


# ---- the plain Deployment + Service ----------------------------------------------------
def test_deployment_args_probes_and_service(repo: Path) -> None:
    deployment, service = load(DEPLOY / "kubernetes" / "oipserve.yaml")
    assert (deployment["kind"], service["kind"]) == ("Deployment", "Service")
    pod = deployment["spec"]["template"]
    labels = deployment["spec"]["selector"]["matchLabels"]
    assert labels.items() <= pod["metadata"]["labels"].items()
    assert service["spec"]["selector"] == labels
    (container,) = pod["spec"]["containers"]
    only_known("container", container, CONTAINER_FIELDS)
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert set(named.values()) == {8000, 8001, 8002}, "Triton's ports, the CLI's defaults"
    for port in service["spec"]["ports"]:
        assert port["targetPort"] in named
    models_mount = next(m for m in container["volumeMounts"] if m["name"] == "models")
    assert models_mount["readOnly"] is True
    launch = localise(container["args"], {}, models_mount["mountPath"], repo)
    running = start(launch)
    try:
        assert {named["http"], named["grpc"], named["metrics"]} == set(running.ports)
        for kind in ("readinessProbe", "livenessProbe", "startupProbe"):
            probe(running, container[kind], named)
        annotations = pod["metadata"]["annotations"]
        status, _ = get(running.local(int(annotations["prometheus.io/port"])), "/metrics")
        assert status == 200
        grace = pod["spec"]["terminationGracePeriodSeconds"]
        pre_stop = int(container["lifecycle"]["preStop"]["exec"]["command"][-1])
        assert pre_stop + running.settings.shutdown_timeout < grace, "drain fits the grace"
    finally:
        assert running.srv.stop() == 0, running.srv.log


# ---- the Containerfiles ----------------------------------------------------------------
def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, rest) pairs of the final stage, continuation lines joined."""
    text = re.sub(r"\\\n", " ", path.read_text())
    lines = [line.strip() for line in text.splitlines()]
    found = [tuple(line.split(None, 1)) for line in lines if line and not line.startswith("#")]
    last_from = max(i for i, (op, *_) in enumerate(found) if op == "FROM")
    return [(op.upper(), rest) for op, rest in found[last_from:]]  # type: ignore[misc]


def image_env(rest: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in shlex.split(rest))


@pytest.mark.parametrize("name", ["Containerfile", "Containerfile.cuda"])
def test_containerfile_entry_point_env_ports_and_healthcheck(name: str, repo: Path) -> None:
    steps = instructions(DEPLOY / name)
    ops = dict(steps)
    entrypoint, cmd = json.loads(ops["ENTRYPOINT"]), json.loads(ops["CMD"])
    assert entrypoint == ["oipserve"] and cmd == ["serve"], "the image runs `oipserve serve`"
    assert ops["USER"] == "1000:1000" and ops["STOPSIGNAL"] == "SIGTERM"
    env = image_env(ops["ENV"])
    assert env["OIPSERVE_HOST"] == "0.0.0.0"
    env = {k: v for k, v in env.items() if k.startswith(("OIPSERVE_", "NVIDIA_"))}
    exposed = {int(p) for p in ops["EXPOSE"].split()}
    # kserve-tritonserver's own args after the image's entry point parse as intended.
    _, swapped = load_settings(KSERVE_TRITONSERVER_ARGS, env)
    assert (swapped.model_repository, swapped.http_port) == ("/mnt/models", 8080)
    if name == "Containerfile.cuda":
        # The wheels' libraries reach the loader through ldconfig, not LD_LIBRARY_PATH.
        assert "LD_LIBRARY_PATH" not in env
        copies = [rest.split()[-1] for op, rest in steps if op == "COPY"]
        assert "/etc/ld.so.conf.d/nvidia-wheels.conf" in copies
        assert ("RUN", "ldconfig") in steps
        assert env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    # Both images' command lines run here (no GPU: the CUDA image's serves on the CPU).
    launch = localise(cmd, env, env["OIPSERVE_MODEL_REPOSITORY"], repo)
    assert exposed == {launch.settings.http_port, launch.settings.grpc_port, 8002}
    running = start(launch)
    try:
        assert set(running.ports) == exposed
        health = ops["HEALTHCHECK"]
        assert "--start-period=" in health
        check = json.loads(health.split("CMD", 1)[1])
        assert check[0] == "python"
        for port, expected in ((running.local(8000), 0), (1, 1)):
            result = subprocess.run(
                [sys.executable, *check[1:]],
                env={**os.environ, "OIPSERVE_HTTP_PORT": str(port)},
                capture_output=True,
                timeout=30,
            )
            assert (result.returncode == 0) == (expected == 0), result.stderr
    finally:
        assert running.srv.stop() == 0, running.srv.log


# ---- orchestration on the node: deploy/place-worker.sh ----------------------------------
def test_place_worker_script_puts_an_endpoint_on_the_chosen_gpu(repo: Path, tmp_path: Path) -> None:
    if shutil.which("curl") is None or shutil.which("jq") is None:
        pytest.skip("deploy/place-worker.sh needs curl and jq")
    inventory = tmp_path / "inventory.json"
    gpu = {"name": "NVIDIA H100 80GB HBM3", "memory_total": 85_899_345_920}
    inventory.write_text(json.dumps({"gpus": [gpu, gpu]}))
    srv = ServerProcess(repo, ["--devices", "cpu", "--hardware-inventory", str(inventory)])
    srv.wait_ready()
    try:
        script = DEPLOY / "place-worker.sh"
        result = subprocess.run(
            [str(script), srv.url, "identity_fp32", "cuda:1"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        endpoint = result.stdout.strip().splitlines()[-1]
        assert f"{endpoint} on cuda:1" in result.stdout and "\n200\n" in result.stdout
        status, body = get(srv.port, "/v2/hardware")
        devices = json.loads(body)["devices"]
        assert endpoint in devices["cuda:1"]["models"]
        assert endpoint not in devices["cuda:0"]["models"]
        # A device the node does not have: /v2/hardware says 404, the script fails.
        bad = subprocess.run(
            [str(script), srv.url, "identity_fp32", "cuda:7"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert bad.returncode != 0
    finally:
        assert srv.stop() == 0, srv.log
