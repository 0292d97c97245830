"""The decode loops and what they hand out: a SpecDecoder (decoder.py) from a DecoderConfig
(config.py) whose parts loading.py builds; Engine (single.py: one sequence) and BatchEngine
(batch.py: continuous batching); a generation in progress (sequence.py) and its text (text.py)."""
