"""The gRPC front door (nvllm.v1.Generator): the wire's checks (wire.py), each RPC's reader (generate_request.py
with generate_chat.py, tokenize_reader.py, pooling_reader.py) and the servicer that translates them onto
DaemonState (service.py)."""
