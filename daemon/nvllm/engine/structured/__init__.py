"""Structured output: constraints compiled into llguidance matchers, their masks, and where a grammar starts."""
