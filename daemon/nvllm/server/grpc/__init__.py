"""The gRPC front door (nvllm.v1.Generator): the wire's checks (wire.py), each RPC's reader (generate_request.py
with generate_chat.py for Generate, tokenize_rpc.py for Tokenize, pooling_rpc.py for Embed and Rerank), the
Health answer (health_reply.py) and the servicer that translates them onto DaemonState (service.py)."""
