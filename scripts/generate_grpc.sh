#!/usr/bin/env bash
# Regenerate oipserve/grpc_generated/ from proto/grpc_service.proto.
#
# Needs grpcio-tools (a `test` extra: pip install -e '.[test]'); the generated
# modules need only grpcio and protobuf at run time. Run from anywhere:
#   scripts/generate_grpc.sh            (uses $PYTHON, default: python3)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3}"
out="$root/oipserve/grpc_generated"

mkdir -p "$out"
"$python" -m grpc_tools.protoc \
    --proto_path="$root/proto" \
    --python_out="$out" \
    --pyi_out="$out" \
    --grpc_python_out="$out" \
    "$root/proto/grpc_service.proto"

# protoc writes `import grpc_service_pb2`, a top-level import; make it package-relative.
sed -i 's/^import grpc_service_pb2 as /from . import grpc_service_pb2 as /' \
    "$out/grpc_service_pb2_grpc.py"

# NOTE: the messages go into a private descriptor pool, not protobuf's default
#   one: tritonclient.grpc registers the same file and symbols (package
#   `inference`), and a process that imports both (tests, benchmarks, a client
#   embedded next to the server) would fail with "duplicate file name".
sed -i 's/^DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile(/DESCRIPTOR = _descriptor_pool.DescriptorPool().AddSerializedFile(/' \
    "$out/grpc_service_pb2.py"
grep -q '_descriptor_pool.DescriptorPool().AddSerializedFile' "$out/grpc_service_pb2.py"

cat > "$out/__init__.py" <<'PY'
"""Generated from proto/grpc_service.proto by scripts/generate_grpc.sh; do not edit."""
PY
echo "generated into $out"
