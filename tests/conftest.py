"""Session-wide test settings."""

import torch

# The tests run thousands of tiny float64 ops. Intra-op threads only add synchronisation cost at
# these sizes, and on a busy 2-core machine they make the suite several times slower.
torch.set_num_threads(1)
