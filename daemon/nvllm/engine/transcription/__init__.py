"""A transcription (speech to text) on the engine: its windows, Whisper's decoding rules, the step's part."""
