"""Audio in: an upload's bytes -> 16 kHz mono float32 samples (clip.py), and Whisper's log-mel features of them
(features.py). A bottom package, as text/ is: the model and the engine read it, the server never (it hands
the engine the upload's bytes)."""
