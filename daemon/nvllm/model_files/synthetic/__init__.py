"""GGUFs written as llama.cpp's tools write them: random weights of real shapes, and a GGUF in another type."""
