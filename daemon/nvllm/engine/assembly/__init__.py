"""Putting an engine together, once: the model loaded, the page pool sized from memory, mapped and backed."""
