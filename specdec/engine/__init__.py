"""The decode loop and what it hands out: a SpecDecoder (decoder.py) from a DecoderConfig
(config.py) whose parts loading.py builds; Engine (core.py: the target, drafter and controllers
every generation shares) and Scheduler (scheduler.py: the one loop, for one request or many,
its drafting in batch_drafting.py); a generation in progress (sequence.py) and its text (text.py)."""
