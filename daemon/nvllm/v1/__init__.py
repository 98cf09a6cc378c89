"""Generated gRPC stubs for proto/nvllm/v1/nvllm.proto (package nvllm.v1).

    from nvllm.v1 import nvllm_pb2, nvllm_pb2_grpc

nvllm_pb2*.py(i) are written by `python tools/gen_proto.py`; never edit them by hand. They need
protobuf >= 7.35.1 and grpcio >= 1.85.1 at runtime (the versions that generated them check it).
"""
