"""The warm cache: pinned prompts computed at start and never evicted, the prefix cache persisted across restarts."""
