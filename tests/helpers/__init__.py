"""What the tests share, imported as `helpers.*` from every folder of tests/: paths; the daemon launcher
and its driver; GGUF writers; the unit sandbox; and the cases or builders that several test files of one
layer use (deploy files, gRPC request cases, GGUF, kernel, sampler, tokenizer and tool-call cases)."""
