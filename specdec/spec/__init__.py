"""Speculation itself, apart from any model and the server: the drafters (proposers/), how
many tokens to draft (controller.py, batch_controller.py, controller_memory.py, calibrate.py)
and verification (verify.py)."""
