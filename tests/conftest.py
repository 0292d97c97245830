import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
# Tiny test models are dominated by per-op overhead: one thread avoids oversubscription.
torch.set_num_threads(1)
