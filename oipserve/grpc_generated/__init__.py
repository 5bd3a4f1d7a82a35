"""Generated from proto/*.proto by scripts/generate_grpc.sh; do not edit.

POOL is the private descriptor pool that holds model_config.proto,
grpc_service.proto and health.proto: tritonclient (and grpcio-health-checking)
registers the same files in protobuf's default pool, and one process may import both.
"""

from google.protobuf import descriptor_pool

POOL = descriptor_pool.DescriptorPool()
