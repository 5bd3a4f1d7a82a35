#!/bin/sh
# Place one ONNX Runtime worker endpoint on a chosen device of one oipserve node, check it
# there with /v2/hardware, and check that it answers. What an operator (or a controller)
# does by hand; docs/deploy.md walks through it, tests/e2e/test_deploy_manifests.py runs it.
#
# Usage: deploy/place-worker.sh URL MODEL DEVICE [INSTANCES]
#   URL     the node's HTTP address, e.g. http://10.0.3.7:8080 (kubectl port-forward ...)
#   MODEL   a model of the node's repository (or a path to an .onnx file inside it)
#   DEVICE  cpu, cuda:N, gpu or auto (the GPU with the most free memory)
# Prints the endpoint's name on the last line. Needs curl and jq.
# Behind --http-restricted-api, add the header: CURL_HEADER='admin-key: secret'.
set -eu
url=$1 model=$2 device=$3 instances=${4:-1}
set -- -fsS
[ -n "${CURL_HEADER:-}" ] && set -- "$@" -H "$CURL_HEADER"

echo "# devices of the node and their free memory"
curl "$@" "$url/v2/hardware" \
  | jq -r '.devices | to_entries[] | "\(.key)\t\(.value.name // "-")\tfree=\(.value.memory_free // .value.memory_available // "-")\tmodels=\(.value.models | join(","))"'

if [ "$device" != auto ]; then
  echo "# is there a $device? (POST /v2/hardware answers 200, or 404 and curl fails)"
  curl "$@" -X POST "$url/v2/hardware" -d "{\"name\": \"$device\", \"num\": 1}"
fi

echo "# load: one onnxruntime endpoint for $model on $device"
endpoint=$(curl "$@" -X POST "$url/v2/workers/onnxruntime/load" \
  -d "{\"model\": \"$model\", \"device\": \"$device\", \"instances\": $instances}")

echo "# where it went, from /v2/hardware"
placed=$(curl "$@" "$url/v2/hardware" \
  | jq -r --arg e "$endpoint" '[.devices | to_entries[] | select(.value.models | index($e)) | .key] | join(",")')
echo "$endpoint on $placed"
case "$device" in
  cpu|cuda:*) [ "$placed" = "$device" ] || { echo "placed on '$placed', not $device" >&2; exit 1; } ;;
esac

echo "# ready? (GET /v2/models/$endpoint/ready)"
curl "$@" -o /dev/null -w '%{http_code}\n' "$url/v2/models/$endpoint/ready"
echo "$endpoint"
