"""Put the repository root on sys.path so tests can `import ppo_ewma` and friends, and run torch on
one thread: the networks in the tests are tiny, and on a 2-core machine a second intra-op thread
only contends with the environments (a Procgen smoke run took 119 s instead of 19 s under load)."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
torch.set_num_threads(1)
