"""Put the repository root on sys.path so tests can `import ppo_ewma` and friends, and run torch on
one thread: the networks in the tests are tiny, and on a 2-core machine a second intra-op thread
only contends with the environments (a Procgen smoke run took 119 s instead of 19 s under load).

The suite runs on the CPU on purpose, also on a machine with a GPU: the recorded scalars and the exact-resume
checks are CPU numbers, and most training tests leave --cuda at its default. So the GPU is hidden before torch is
imported, unless TEST_CUDA=1 asks for it (CI has no GPU, so only a GPU machine can run that way). Hiding it also
keeps the pytest process free of a CUDA context, which forked workers could not inherit (test_torchrun.py forks
from a forkserver anyway)."""
import os
import sys

if os.environ.get("TEST_CUDA") != "1":
    os.environ["CUDA_VISIBLE_DEVICES"] = ""

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
torch.set_num_threads(1)
