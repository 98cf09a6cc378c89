"""The board the daemon runs on: its heat (heat.py, read by heat_monitor.py) and its memory (memory_watchdog.py)."""
