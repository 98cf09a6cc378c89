"""Model files on disk: the known models and their pull, a models folder listed, GGUFs written as llama.cpp's
tools write them."""
