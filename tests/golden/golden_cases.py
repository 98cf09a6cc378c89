"""What the golden reference files are made of: the prompt lengths, the texts, and the greedy, encode and
chat cases that make_golden.py runs through transformers for each model folder. The script imports this
module from its own directory (tests/golden/), so it still runs by hand as before.

Changing anything here means regenerating the goldens (see make_golden.py's docstring).
"""

from __future__ import annotations

from typing import Any

PROMPT_LEN = 64
BATCH_LENGTHS = (5, 17, 33, 64)
MAX_NEW_TOKENS = 32
NEAR_TIE = 1e-3

# A real text for the large model: English, code and digits, well over 64 tokens.
MAIN_TEXT = (
    "The Jetson board reads 3 sensors every 250 ms and logs them to a file. Here is the loop:\n"
    "def poll(sensors, period=0.25):\n"
    "    for step in range(1000):\n"
    "        values = [s.read() for s in sensors]\n"
    "        log.write(f\"{step},{values}\\n\")\n"
    "        time.sleep(period)\n"
    "In 2024 the fleet had 1,536 drones; each one answered 42 voice queries a day on average."
)

# Real texts for the large model's packed-batch case, one per length in BATCH_LENGTHS (truncated).
BATCH_TEXTS = (
    "Paris is the capital and most populous city of France, with an estimated population of two million.",
    "Die Größe des Hauses beträgt 120 Quadratmeter; es wurde 1987 gebaut und 2015 renoviert, "
    "wobei die Heizung über das Dach läuft und die Fenster nach Süden zeigen, damit es hell ist.",
    "import numpy as np\n\ndef softmax(x: np.ndarray) -> np.ndarray:\n"
    "    z = x - x.max(axis=-1, keepdims=True)\n    e = np.exp(z)\n"
    "    return e / e.sum(axis=-1, keepdims=True)\n\nprint(softmax(np.arange(5.0)))\n",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who counted the waves. "
    "Every morning he walked to the harbour, untied his boat and rowed out past the lighthouse, singing "
    "the songs his father had taught him, while the gulls circled above and the sun rose over the hills "
    "behind the church. He caught 7 fish on Monday, 12 on Tuesday and none at all on Wednesday.",
)

# Greedy cases for the large model: (name, kind, messages-or-prompt). Only those with a clear greedy path
# (min_margin > NEAR_TIE) are kept, plus the ones in ALWAYS_KEEP.
SMOLLM2_GREEDY: tuple[tuple[str, str, Any], ...] = (
    ("capital_france", "chat", [{"role": "user", "content": "What is the capital of France?"}]),
    ("capital_germany", "chat", [{"role": "user", "content": "What is the capital of Germany?"}]),
    ("minutes_digits", "chat", [{"role": "user", "content": "How many minutes are in 3 hours?"}]),
    ("count_digits", "chat", [{"role": "user", "content": "Count from 1 to 10."}]),
    ("leap_year_system", "chat", [
        {"role": "system", "content": "You are a concise assistant. Answer in one sentence."},
        {"role": "user", "content": "How many days are in a leap year?"},
    ]),
    ("python_square", "chat", [
        {"role": "user", "content": "Write a Python function that returns the square of a number."},
    ]),
    ("german_question", "chat", [{"role": "user", "content": "Wie groß ist der Eiffelturm in Metern?"}]),
    ("german_austria", "chat", [{"role": "user", "content": "Wie heißt die Hauptstadt von Österreich?"}]),
    ("french_translate", "chat", [{"role": "user", "content": "Translate to French: thank you"}]),
    ("japanese_question", "chat", [{"role": "user", "content": "東京はどこの国の首都ですか？"}]),
    ("multi_turn", "chat", [
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": "Nice to meet you, Ada! How can I help you today?"},
        {"role": "user", "content": "What is my name?"},
    ]),
    ("raw_story", "raw", "Once upon a time, there was a"),
    ("raw_code", "raw", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
    ("raw_digits", "raw", "1, 2, 3, 4, 5, 6, 7, 8,"),
    ("raw_german", "raw", "Die Größe des Hauses beträgt"),
    ("raw_french", "raw", "Le café de la gare était fermé, alors nous sommes allés"),
    ("raw_capital", "raw", "The capital of Germany is"),
    ("raw_japanese", "raw", "東京は日本の"),
)
ALWAYS_KEEP = {"capital_france"}
SMOLLM2_GREEDY_MIN = 10

# Greedy cases for the tiny random-weight models (their text is noise; the token ids are what matters);
# TINY_GREEDY_PER_KIND chat and raw cases are kept.
TINY_GREEDY: tuple[tuple[str, str, Any], ...] = (
    ("chat_hello", "chat", [{"role": "user", "content": "Hello! What is 2 + 2?"}]),
    ("chat_system", "chat", [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Name a colour."},
    ]),
    ("raw_text", "raw", "The quick brown fox jumps over the lazy dog."),
    ("raw_code", "raw", "def add(a, b):\n    return a + b\n"),
    ("chat_multi", "chat", [
        {"role": "user", "content": "Hi."},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Count to 5."},
    ]),
    ("raw_digits", "raw", "12345 67890"),
    ("raw_german", "raw", "Größe und Gewicht"),
    ("chat_french", "chat", [{"role": "user", "content": "Où est la gare ?"}]),
    ("chat_tokyo", "chat", [{"role": "user", "content": "東京 🚀 12345"}]),
    ("raw_mixed", "raw", "Hello, world! 12345"),
    ("raw_tokyo", "raw", "東京は日本の首都です。"),
    ("raw_json", "raw", '{"name": "nvllm", "ok": true}'),
)
TINY_GREEDY_PER_KIND = 2  # chat and raw cases kept per tiny model

ENCODE_TEXTS = (
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "12345",
    "3.14159 + 2.71828 = 5.85987; 1,000,000 items",
    "def f(x):\n    return x * 2\n\n\tindented_with_tab = True\n",
    "if (a && b) { return c[0]; }  // C-ish",
    "Größe",
    "東京",
    "🚀",
    "Ünïcödé: café, naïve, façade, Straße, Здравствуйте, مرحبا",
    "  leading spaces",
    "trailing spaces   ",
    " ",
    "",
    "line one\nline two\n\nline four\r\n",
    "   \n\t  mixed   whitespace \t\n",
    "emoji 👍🏽 and a family 👨‍👩‍👧 in text",
    "don't won't it's I'm",
)

CHAT_CASES: tuple[tuple[list[dict[str, str]], bool], ...] = (
    ([{"role": "system", "content": "You are a helpful assistant."},
      {"role": "user", "content": "What is the capital of France?"}], True),
    ([{"role": "user", "content": "What is the capital of France?"}], True),
    ([{"role": "user", "content": "Hi!"},
      {"role": "assistant", "content": "Hello! How can I help?"},
      {"role": "user", "content": "Tell me a joke about 42."}], True),
    ([{"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Größe von 東京? 🚀"},
      {"role": "assistant", "content": "Very large."}], False),
    ([{"role": "user", "content": "def f(x):\n\treturn x\n"}], True),
)
