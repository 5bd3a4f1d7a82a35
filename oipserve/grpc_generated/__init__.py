"""Generated from proto/grpc_service.proto by scripts/generate_grpc.sh; do not edit."""
