"""Fixed text the tools use: held-out prompt suites (prompts.py) and token frequencies
(frequent_tokens.py)."""
