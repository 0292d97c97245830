"""Speculation itself, apart from any model and the server: the drafters (proposers/), how
many tokens to draft (control/, calibrate.py)
and verification (verify.py)."""
