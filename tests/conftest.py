"""Suite-wide settings.

Every tensor in the toy and the math tests has at most a few thousand elements: torch's intra-op
threads only add overhead there, and on a busy 2-core machine a lot of it, so the suite runs torch on
one thread (the app and the toy CLI do the same).
"""

import torch

torch.set_num_threads(1)
