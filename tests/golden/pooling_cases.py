"""The inputs of the embedding and reranking goldens (make_golden_pooling.py runs them through transformers for
tiny-bert, tiny-bert-cls, tiny-bert-reranker and tiny-xlmr-reranker); the tests read the same ones from here.

Changing anything here means regenerating the goldens (see make_golden_pooling.py's docstring).
"""

from __future__ import annotations

# Texts of 1 to ~100 tokens (without [CLS] / [SEP]): punctuation, capitals, accents (the uncased normalizer
# strips them), digits (split into pieces), a word with an emoji in it (one [UNK] for the whole word), CJK
# (one [UNK] per character) and a word longer than WordPiece's 100-character limit ([UNK]).
EMBED_TEXTS: tuple[str, ...] = (
    "the",
    "The capital of France is Paris.",
    "How do I reset my password? Open the settings page, then choose SECURITY!",
    "In 2024 the fleet had 1,536 drones; each one answered 42 queries a day (on average).",
    "The rocket\U0001f680 launched from the old harbour at 12:30, and the crowd cheered.",
    "ÜBER-fast Café in Zürich: naïve résumé, 東京 and \"quotes\" — all in one line.",
    "Honey bees visit thousands of flowers each day and carry pollen back to their hive, "
    "while the gardener counts " + "z" * 120 + " weeds.",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who counted the waves. "
    "Every morning he walked to the harbour, untied his boat and rowed out past the lighthouse. "
    "He caught 7 fish on Monday and 12 on Tuesday.",
)

# Sentence pairs, encoded as one input ([CLS] A [SEP] B [SEP], token types 0 then 1), embedded as one.
EMBED_PAIRS: tuple[tuple[str, str], ...] = (
    ("What is the capital of Italy?", "Rome is the capital of Italy."),
    ("bees", "Honey bees visit thousands of flowers each day and carry pollen back to their hive."),
)

# The reranker scores (query, document) for each document: one raw logit per pair.
RERANK_QUERY = "What is the capital of France?"
RERANK_DOCUMENTS: tuple[str, ...] = (
    "Paris is the capital and most populous city of France.",
    "The capital of Germany is Berlin.",
    "France",
    "Honey bees visit thousands of flowers each day and carry pollen back to their hive.",
    "What is the capital of France? Nobody in the small village by the sea could say, but the old "
    "fisherman, who had sailed to 12 ports and counted 1,536 waves, said it was Paris.",
    "Café au lait in Paris costs 3.50 \u20ac.",
)

# Texts for a SentencePiece Unigram tokenizer (tiny-xlmr-reranker's) beside the ones above: runs of spaces at the
# ends and inside, and what its normalization map rewrites (no-break and ideographic spaces, full-width letters
# and digits, a ligature, an ellipsis, a circled digit, a decomposed letter), a special token's text inside a
# word, and unknown characters side by side. No tab and no newline: llama-embedding reads those as separators.
UNIGRAM_TEXTS: tuple[str, ...] = (
    "  Spaces   before, between  and after   ",
    "no\u00a0break\u3000ideographic",
    "\uff21\uff22\uff23 \uff54\uff49\uff4e\uff59 \uff11\uff12\uff13 \ufb01sh and chips\u2026 \u2460 cafe\u0301 au lait",
    "a <mask> b</s>c and <s> alone",
    "\u6771\u4eac\U0001f680 \u00dcBER na\u00efve",
)
