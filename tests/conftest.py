import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
# Tiny test models are dominated by per-op overhead: one thread avoids oversubscription.
torch.set_num_threads(1)
# Controllers must not learn from earlier test runs (or the developer's own runs) through the
# cache file: tests that exercise controller memory name their own file.
os.environ["SPECDEC_CONTROLLER_MEMORY"] = "off"
