#!/usr/bin/env bash
# Build an image of oipserve without a container runtime, prove it runs, pack it.
#
# VARIANT=cpu (the default) does what deploy/Containerfile does, VARIANT=cuda what
# deploy/Containerfile.cuda does, with Debian's tools where containers cannot start:
#   1. builder: a Debian root filesystem (mmdebstrap) with python3 + venv; in a chroot of
#      it, a venv at /opt/oipserve with oipserve from this checkout and the variant's ONNX
#      Runtime (deploy/requirements_for.py: CPU build, or onnxruntime-gpu[cuda,cudnn]
#      with NVIDIA's CUDA and cuDNN libraries as pip wheels).
#   2. runtime: a second, smaller root filesystem (python3 only); /opt/oipserve copied in;
#      user and group 1000 (multi-stage: no pip, no compilers, no apt lists in the image).
#      cuda: the wheels' lib directories in /etc/ld.so.conf.d/nvidia-wheels.conf, ldconfig.
#   3. smoke test: in a private mount namespace, the runtime root mounted READ-ONLY, a
#      test repository mounted read-only at /mnt/models, /tmp and /dev/shm as tmpfs; the
#      server is started in a chroot as uid 1000 with kserve-tritonserver's own arguments
#      (`tritonserver --model-store=/mnt/models ...`), probed (ready, live, metrics, one
#      inference), stopped with SIGTERM (exit code 0 expected), and the repository is
#      checked unchanged (every file's size, mode, mtime and sha256).
#      cuda, before the server: ONNX Runtime lists CUDAExecutionProvider, and `ldd` finds
#      every library the CUDA provider links (libcuda.so.1, the driver's, excepted: the
#      node mounts it at run time), and every library of the wheels loads by its bare
#      name (dlopen, as cuDNN is loaded). The server then runs with the CUDA runtime's
#      `--devices=auto`: with no GPU here it must find a CPU-only inventory and serve on
#      the CPU provider.
#   4. pack: umoci writes an OCI image layout (one layer, the image config: entry point,
#      CMD, env, user, ports, stop signal), skopeo turns it into a docker archive that
#      `docker load` / `podman load` read.
# Prints a summary with the sizes. Needs root, mmdebstrap, umoci, skopeo, and network
# access to Debian's mirror and PyPI:
#   apt-get install -y mmdebstrap umoci skopeo
#
# Usage: [VARIANT=cpu|cuda] deploy/build-image.sh [OUTPUT_DIR]
#        (default: build/image; TAG=0.1.0-$VARIANT)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=$(realpath -m -- "${1:-$ROOT/build/image}")
VARIANT=${VARIANT:-cpu}
case $VARIANT in
    cpu) DEVICES=cpu ;;
    cuda) DEVICES=auto ;;
    *) echo "build-image: VARIANT must be cpu or cuda, not '$VARIANT'" >&2; exit 2 ;;
esac
export VARIANT
TAG=${TAG:-0.1.0-$VARIANT}
SUITE=${SUITE:-bookworm}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
VENV=/opt/oipserve

if [[ "${1:-}" == "--smoke-inside" ]]; then
    # Runs in `unshare -m`: mounts here vanish with the namespace.
    rootfs=$2 models=$3
    mount --bind "$rootfs" "$rootfs"
    mount -t proc proc "$rootfs/proc"
    mount --rbind /dev "$rootfs/dev"
    mount -t tmpfs -o size=512m tmpfs "$rootfs/dev/shm"
    mount -t tmpfs -o size=64m tmpfs "$rootfs/tmp"
    mount --bind "$models" "$rootfs/mnt/models"
    mount -o remount,bind,ro "$rootfs/mnt/models"
    mount -o remount,bind,ro "$rootfs"
    if touch "$rootfs/opt/probe" 2>/dev/null || touch "$rootfs/mnt/models/probe" 2>/dev/null; then
        echo "smoke: the root or /mnt/models is writable, the test would prove nothing" >&2
        exit 1
    fi
    # The image's environment (its config's Env), as uid 1000, for every command below.
    image_env=(/usr/bin/env -i PATH="$VENV/bin:/usr/bin:/bin" PYTHONUNBUFFERED=1
               OIPSERVE_HOST=0.0.0.0)
    if [[ $VARIANT == cuda ]]; then
        image_env+=(NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility)
        chroot --userspec=1000:1000 "$rootfs" "${image_env[@]}" python -c '
import onnxruntime
providers = onnxruntime.get_available_providers()
print("smoke: onnxruntime", onnxruntime.__version__, providers)
assert "CUDAExecutionProvider" in providers, "no CUDAExecutionProvider"'
        provider=$(chroot --userspec=1000:1000 "$rootfs" "${image_env[@]}" python -c '
import os, onnxruntime
print(os.path.join(os.path.dirname(onnxruntime.__file__), "capi", "libonnxruntime_providers_cuda.so"))')
        # No LD_LIBRARY_PATH: the loader finds the wheels' libraries through ldconfig's cache.
        deps=$(chroot --userspec=1000:1000 "$rootfs" "${image_env[@]}" ldd "$provider")
        grep -E 'libcu|libnv' <<<"$deps" | sed "s|$VENV/lib/python3[.0-9]*/site-packages/||; s/ (0x.*//; s/^\s*/smoke: ldd: /"
        missing=$(grep 'not found' <<<"$deps" | grep -v '^\s*libcuda\.so\.1 ' || true)
        if [[ -n $missing ]]; then
            echo "smoke: the CUDA provider's libraries are not all found:" >&2
            echo "$missing" >&2
            exit 1
        fi
        echo "smoke: ldd: $(grep -c '=> /' <<<"$deps") libraries resolved, not found: $(grep 'not found' <<<"$deps" | awk '{print $1}' | paste -sd' ' -) (the driver's, from the node)"
        # cuDNN, cuFFT and NVRTC are not linked but dlopen()ed by name when a session
        # starts: each library of the wheels must load by its bare name, through the cache.
        chroot --userspec=1000:1000 "$rootfs" "${image_env[@]}" python -c '
import ctypes, pathlib, sys
loaded, driver, failed = [], [], []
for folder in open("/etc/ld.so.conf.d/nvidia-wheels.conf").read().split():
    for lib in sorted(pathlib.Path(folder).glob("lib*.so.*")):
        try:
            ctypes.CDLL(lib.name)
            loaded.append(lib.name)
        except OSError as error:
            (driver if "libcuda.so.1:" in str(error) else failed).append(f"{lib.name}: {error}")
print("smoke: dlopen by name:", len(loaded), "loaded:", " ".join(loaded))
for line in driver:
    print("smoke: dlopen needs the driver:", line)
sys.exit("smoke: dlopen failed: " + "; ".join(failed) if failed else 0)'
    fi
    read -r http grpc metrics < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))')
    # kserve-tritonserver's args, ports moved off 8080/9000/8002 to free ones.
    chroot --userspec=1000:1000 "$rootfs" "${image_env[@]}" \
        oipserve tritonserver --model-store=/mnt/models --grpc-port="$grpc" \
        --http-port="$http" --metrics-port="$metrics" --allow-grpc=true --allow-http=true \
        --devices="$DEVICES" >"$rootfs.log" 2>&1 &
    pid=$!
    python3 - "$http" "$metrics" "$pid" <<'EOF'
import json, sys, time, urllib.request as u
http, metrics, pid = sys.argv[1], sys.argv[2], int(sys.argv[3])
base = f"http://127.0.0.1:{http}"
deadline = time.monotonic() + 120
while True:
    try:
        if u.urlopen(base + "/v2/health/ready", timeout=2).status == 200:
            break
    except OSError:
        pass
    if time.monotonic() > deadline:
        sys.exit("smoke: not ready after 120 s")
    time.sleep(0.5)
print("smoke: ready", round(time.monotonic() - deadline + 120, 1), "s after start")
print("smoke: live", u.urlopen(base + "/v2/health/live", timeout=2).status)
body = u.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5).read().decode()
print("smoke: metrics", sum(1 for line in body.splitlines() if line.startswith("nv_")), "nv_ samples")
request = {"inputs": [
    {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))},
    {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16}]}
answer = json.load(u.urlopen(u.Request(base + "/v2/models/simple/infer",
                                       data=json.dumps(request).encode()), timeout=10))
sums = {o["name"]: o["data"] for o in answer["outputs"]}
assert sums["OUTPUT0"] == [i + 1 for i in range(16)], answer
print("smoke: inference on simple: OUTPUT0 =", sums["OUTPUT0"][:4], "...")
devices = json.load(u.urlopen(base + "/v2/hardware", timeout=5))["devices"]
sessions = {i["model"]: i["session_providers"] for d in devices.values() for i in d["instances"]}
print("smoke: /v2/hardware devices:", sorted(devices), "session providers:", sessions)
assert sessions.get("simple"), sessions
EOF
    kill -TERM "$pid"
    code=0
    wait "$pid" || code=$?
    echo "smoke: exit code after SIGTERM: $code"
    leftovers=$(ls "$rootfs/dev/shm" | wc -l)
    echo "smoke: /dev/shm entries left: $leftovers"
    grep -m1 " ready " "$rootfs.log" | sed 's/^/smoke: log: /'
    grep -m1 "request path" "$rootfs.log" | sed 's/^/smoke: log: /'
    [[ $code == 0 && $leftovers == 0 ]]
    exit
fi

for tool in mmdebstrap umoci skopeo unshare chroot; do
    command -v "$tool" >/dev/null || { echo "build-image: $tool is missing" >&2; exit 1; }
done
[[ $(id -u) == 0 ]] || { echo "build-image: run as root (chroot, mounts)" >&2; exit 1; }

WORK=$(mktemp -d /var/tmp/oipserve-image.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
started=$SECONDS
step() { echo "== $(( SECONDS - started ))s: $*"; }

step "builder root filesystem ($SUITE, python3, venv)"
mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,python3-dev,gcc,libc6-dev,ca-certificates \
    "$SUITE" "$WORK/builder" "$MIRROR"
mkdir -p "$WORK/builder/src/deploy"
cp -r "$ROOT/pyproject.toml" "$ROOT/setup.py" "$ROOT/README.md" "$ROOT/oipserve" "$ROOT/workers" \
    "$ROOT/hardware" "$WORK/builder/src/"
cp "$ROOT/deploy/requirements_for.py" "$WORK/builder/src/deploy/"
find "$WORK/builder/src" -name __pycache__ -prune -exec rm -rf {} +
# An editable install's build (setup.py's, in place): the builder compiles its own.
find "$WORK/builder/src" \( -name '*.so' -o -name compiled.json \) -delete
cp /etc/resolv.conf "$WORK/builder/etc/resolv.conf"
# This machine's CA bundle, in case it reaches PyPI through an inspecting proxy.
cp /etc/ssl/certs/ca-certificates.crt "$WORK/builder/src/ca.crt"

step "venv in the builder chroot (Containerfile's RUN step)"
unshare -m sh -c "mount -t proc proc '$WORK/builder/proc' && chroot '$WORK/builder' \
    /usr/bin/env -i PATH=/usr/bin:/bin HOME=/root PIP_CERT=/src/ca.crt \
    PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_PROGRESS_BAR=off sh -ec '
        python3 /src/deploy/requirements_for.py $VARIANT /src/pyproject.toml > /tmp/requirements.txt
        python3 -m venv $VENV
        $VENV/bin/pip install --quiet -r /tmp/requirements.txt
        $VENV/bin/pip install --quiet --no-deps /src
        $VENV/bin/pip uninstall --quiet -y pip setuptools
        $VENV/bin/python -c \"import onnxruntime, oipserve; print(\\\"onnxruntime\\\", onnxruntime.__version__, onnxruntime.get_available_providers())\"
        if [ $VARIANT = cuda ]; then
            find $VENV/lib/python3*/site-packages/nvidia -maxdepth 2 -type d -name lib \
                > /tmp/nvidia-libs.conf
        fi
    '"

step "runtime root filesystem ($SUITE, python3 only)"
mmdebstrap --quiet --variant=minbase --include=python3 \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    "$SUITE" "$WORK/rootfs" "$MIRROR"
cp -a "$WORK/builder$VENV" "$WORK/rootfs$VENV"
echo "oipserve:x:1000:1000::/nonexistent:/usr/sbin/nologin" >> "$WORK/rootfs/etc/passwd"
echo "oipserve:x:1000:" >> "$WORK/rootfs/etc/group"
mkdir -p "$WORK/rootfs/models" "$WORK/rootfs/mnt/models"
rm -rf "$WORK/rootfs/var/cache/apt/"* "$WORK/rootfs/var/lib/apt/lists/"*
if [[ $VARIANT == cuda ]]; then
    # Containerfile.cuda's COPY of nvidia-libs.conf and RUN ldconfig.
    cp "$WORK/builder/tmp/nvidia-libs.conf" "$WORK/rootfs/etc/ld.so.conf.d/nvidia-wheels.conf"
    chroot "$WORK/rootfs" ldconfig
    echo "ldconfig: $(wc -l < "$WORK/rootfs/etc/ld.so.conf.d/nvidia-wheels.conf") directories," \
        "$(chroot "$WORK/rootfs" ldconfig -p | grep -c "$VENV/") libraries of the wheels in the cache"
fi

step "smoke test: chroot, uid 1000, read-only root and read-only /mnt/models"
mkdir -p "$WORK/models"
cp -r "$ROOT/model-repository/simple" "$WORK/models/"
chown -R 0:0 "$WORK/models"
fingerprint() {
    (cd "$1" && find . -printf '%p %s %m %T@\n' | sort && find . -type f -exec sha256sum {} + | sort)
}
before=$(fingerprint "$WORK/models")
unshare -m "$0" --smoke-inside "$WORK/rootfs" "$WORK/models"
after=$(fingerprint "$WORK/models")
if [[ "$before" != "$after" ]]; then
    echo "build-image: the server changed the model repository" >&2
    diff <(echo "$before") <(echo "$after") >&2 || true
    exit 1
fi
echo "smoke: model repository unchanged ($(cd "$WORK/models" && find . | wc -l) entries compared)"
rm -f "$WORK/rootfs.log"

step "pack: OCI layout (umoci) and docker archive (skopeo)"
cuda_env=()
[[ $VARIANT == cuda ]] && cuda_env=(--config.env NVIDIA_VISIBLE_DEVICES=all
                                   --config.env NVIDIA_DRIVER_CAPABILITIES=compute,utility)
mkdir -p "$OUT"
rm -f "$OUT/oipserve-$TAG.tar"
# One OCI layout for both variants: replace only this tag.
[[ -e "$OUT/oci/index.json" ]] || umoci init --layout "$OUT/oci"
umoci rm --image "$OUT/oci:$TAG" 2>/dev/null || true
umoci new --image "$OUT/oci:$TAG"
umoci insert --rootless=false --image "$OUT/oci:$TAG" "$WORK/rootfs" / >/dev/null
umoci config --image "$OUT/oci:$TAG" \
    --config.user 1000:1000 --config.workingdir / \
    --config.entrypoint oipserve --config.cmd serve \
    --config.env "PATH=$VENV/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    --config.env PYTHONUNBUFFERED=1 --config.env OIPSERVE_HOST=0.0.0.0 \
    --config.env OIPSERVE_MODEL_REPOSITORY=/models "${cuda_env[@]}" \
    --config.exposedports 8000/tcp --config.exposedports 8001/tcp \
    --config.exposedports 8002/tcp --config.stopsignal SIGTERM \
    --author oipserve --history.comment "deploy/build-image.sh"
umoci gc --layout "$OUT/oci"
skopeo copy --quiet "oci:$OUT/oci:$TAG" "docker-archive:$OUT/oipserve-$TAG.tar:oipserve:$TAG"

step "summary"
layer=$(skopeo inspect --raw "oci:$OUT/oci:$TAG" | python3 -c 'import json, sys; print(sum(l["size"] for l in json.load(sys.stdin)["layers"]))')
echo "image oipserve:$TAG"
echo "  root filesystem: $(du -sh --apparent-size "$WORK/rootfs" | cut -f1) (of which $VENV: $(du -sh --apparent-size "$WORK/rootfs$VENV" | cut -f1))"
echo "  compressed layer: $(numfmt --to=iec "$layer")"
echo "  docker archive: $OUT/oipserve-$TAG.tar ($(du -sh --apparent-size "$OUT/oipserve-$TAG.tar" | cut -f1))"
echo "  OCI layout: $OUT/oci"
echo "  config: $(skopeo inspect --config "oci:$OUT/oci:$TAG" | python3 -c 'import json, sys; print(json.dumps(json.load(sys.stdin)["config"]))')"
echo "  python: $(chroot "$WORK/rootfs" python3 --version)"
echo "  largest packages in the venv:"
du -s --apparent-size -B1M "$WORK/rootfs$VENV"/lib/python3*/site-packages/* 2>/dev/null \
    | sort -rn | head -6 | awk '{printf "    %5d MiB  %s\n", $1, $2}' | sed "s|$WORK/rootfs||"
