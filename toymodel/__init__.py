"""The tabular toy of Cancellation Lab: the DFPO paper's toy problems, exact and simulated.

- ``policy``: ``TabularPolicy``, a softmax policy with one logit vector per context over an explicit
  support of complete trajectories; exact probabilities, entropy, KL and sampling;
- ``scenarios``: the named toy problems (App. A, App. F, a template task), ``SCENARIOS``, ``get_scenario``;
- ``simulate``: training runs of any ``cancellation`` objective on a scenario, one tidy row per step;
- ``neural``: ``NeuralPolicy``, a small neural policy over a scenario's support (tokens couple through
  shared weights);
- ``values``: ``exact_token_values``, the counterfactual token value of the cancellation-hypothesis paper
  (App. E.2 eq. 20), exact by enumeration of the support.

Command line: ``python -m toymodel --help`` and ``python -m toymodel demo``.
"""

from .batched import seed_rows, simulate_seeds
from .neural import NeuralPolicy
from .policy import TabularPolicy
from .scenarios import SCENARIOS, Scenario, clip_asymmetry_policies, get_scenario, shared_prefix_policies
from .simulate import ROW_KEYS, simulate, summarize
from .values import TokenValues, exact_token_values

__all__ = [
    "ROW_KEYS",
    "SCENARIOS",
    "NeuralPolicy",
    "Scenario",
    "TabularPolicy",
    "TokenValues",
    "clip_asymmetry_policies",
    "exact_token_values",
    "get_scenario",
    "seed_rows",
    "shared_prefix_policies",
    "simulate",
    "simulate_seeds",
    "summarize",
]
