#!/usr/bin/env bash
# Regenerate oipserve/grpc_generated/ from proto/model_config.proto,
# proto/grpc_service.proto (which imports the former) and proto/health.proto (gRPC's
# standard health checking messages).
#
# Needs grpcio-tools (a `test` extra: pip install -e '.[test]'); the generated
# modules need only protobuf at run time. Only messages are generated: the
# front serves the service on its own HTTP/2 from a method table built from the
# message classes (oipserve/front/grpc/handlers.py, docs/grpc.md), so no
# *_pb2_grpc.py stubs. Run from anywhere, no venv needs to be activated:
#   scripts/generate_grpc.sh   (uses $PYTHON, else the repository's .venv/bin/python
#                               when it exists, else python3)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -n "${PYTHON:-}" ]]; then
    python="$PYTHON"
elif [[ -x "$root/.venv/bin/python" ]]; then
    python="$root/.venv/bin/python"
else
    python=python3
fi
if ! "$python" -c 'import grpc_tools' 2>/dev/null; then
    echo "generate_grpc.sh: $python has no grpcio-tools; install the test extra" \
        "(python3 -m venv .venv && .venv/bin/pip install -e '.[test]') or set PYTHON" >&2
    exit 1
fi
out="$root/oipserve/grpc_generated"

mkdir -p "$out"
rm -f "$out"/*_pb2.py "$out"/*_pb2.pyi "$out"/*_pb2_grpc.py
"$python" -m grpc_tools.protoc \
    --proto_path="$root/proto" \
    --python_out="$out" \
    --pyi_out="$out" \
    "$root/proto/model_config.proto" \
    "$root/proto/grpc_service.proto" \
    "$root/proto/health.proto"

# protoc writes `import model_config_pb2` and `from model_config_pb2 import *`
# (top-level imports); make them package-relative.
sed -i -e 's/^import model_config_pb2 as /from . import model_config_pb2 as /' \
    -e 's/^from model_config_pb2 import \*/from .model_config_pb2 import */' \
    "$out/grpc_service_pb2.py"
sed -i -e 's/^from model_config_pb2 import /from .model_config_pb2 import /' \
    -e 's/^import model_config_pb2 as /from . import model_config_pb2 as /' \
    "$out/grpc_service_pb2.pyi"

# NOTE: the messages go into a private descriptor pool (POOL, in __init__.py),
#   not protobuf's default one: tritonclient.grpc registers the same files and
#   symbols (package `inference`), and a process that imports both (tests,
#   benchmarks, a client embedded next to the server) would fail with
#   "duplicate file name" (grpcio-health-checking registers health.proto the same
#   way). The files share the one pool because grpc_service.proto imports
#   model_config.proto.
for name in model_config grpc_service health; do
    sed -i 's/^DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile(/from . import POOL as _POOL\nDESCRIPTOR = _POOL.AddSerializedFile(/' \
        "$out/${name}_pb2.py"
    grep -q '^DESCRIPTOR = _POOL.AddSerializedFile' "$out/${name}_pb2.py"
done
! grep -Eq '^(import [a-z_]*_pb2|from [a-z_]*_pb2 import)' "$out"/*_pb2.py "$out"/*_pb2.pyi

cat > "$out/__init__.py" <<'PY'
"""Generated from proto/*.proto by scripts/generate_grpc.sh; do not edit.

POOL is the private descriptor pool that holds model_config.proto,
grpc_service.proto and health.proto: tritonclient (and grpcio-health-checking)
registers the same files in protobuf's default pool, and one process may import both.
"""

from google.protobuf import descriptor_pool

POOL = descriptor_pool.DescriptorPool()
PY
echo "generated into $out"
