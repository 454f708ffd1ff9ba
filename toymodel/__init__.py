"""The tabular toy of Cancellation Lab: the DFPO paper's toy problems, exact and simulated.

- ``policy``: ``TabularPolicy``, a softmax policy with one logit vector per context over an explicit
  support of complete trajectories; exact probabilities, entropy, KL and sampling;
- ``scenarios``: the named toy problems (App. A, App. F, a template task), ``SCENARIOS``, ``get_scenario``;
- ``simulate``: training runs of any ``cancellation`` objective on a scenario, one tidy row per step.

Command line: ``python -m toymodel --help`` and ``python -m toymodel demo``.
"""

from .batched import seed_rows, simulate_seeds
from .policy import TabularPolicy
from .scenarios import SCENARIOS, Scenario, clip_asymmetry_policies, get_scenario, shared_prefix_policies
from .simulate import ROW_KEYS, simulate, summarize

__all__ = [
    "ROW_KEYS",
    "SCENARIOS",
    "Scenario",
    "TabularPolicy",
    "clip_asymmetry_policies",
    "get_scenario",
    "seed_rows",
    "shared_prefix_policies",
    "simulate",
    "simulate_seeds",
    "summarize",
]
