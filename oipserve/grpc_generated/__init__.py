"""Generated from proto/*.proto by scripts/generate_grpc.sh; do not edit.

POOL is the private descriptor pool that holds model_config.proto and
grpc_service.proto: tritonclient registers the same `inference` files in
protobuf's default pool, and one process may import both.
"""

from google.protobuf import descriptor_pool

POOL = descriptor_pool.DescriptorPool()
