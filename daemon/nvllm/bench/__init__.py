"""The benchmarks: every figure measured beside this machine's own floors, in process, through a daemon, or alone."""
