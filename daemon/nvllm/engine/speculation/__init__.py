"""Speculative decoding: who gets proposals (n-grams or a draft model), how many a step verifies, what was kept."""
