"""How much to draft each step, from measured costs and acceptance: draft_length.py (chains),
tree_size.py (trees), batch_width.py (one length for a batched step), memory.py (what they
learned, kept between processes), base.py (what they share)."""
