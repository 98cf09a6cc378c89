"""The OpenAI-compatible HTTP API: a second front door onto the same engine, admission and limits as gRPC."""
