"""Solutions to the exercises of tutorial 3 (`tutorials/03_equivalent_solutions_and_entropy_collapse.py`): try them yourself first.

Each function is meant to replace the exercise cell of the same name in the notebook: it uses the
notebook's variables (`policy`, `mask`, ...) and imports, so this file is not run on its own. The
tutorial tests (`tests/tutorials`) run every notebook with these bodies put in its exercise cells.
"""

# ruff: noqa: F821


def my_sequence_weights(theta: torch.Tensor) -> torch.Tensor:
    """(3,) GSPO sequence weights at θ against θ_old, from whole-trajectory log-probabilities."""
    log_ratio = policy.traj_logp(theta) - policy.traj_logp(theta_old)
    return (log_ratio / policy.lengths).exp()


def my_log_odds_drift() -> float:
    """Final minus initial equiv_log_odds of the 60-step GSPO run (ε = 0.2, seed 3)."""
    rows = simulate(sc, "gspo", steps=60, seed=3, epsilon_low=0.2, epsilon_high=0.2)
    return rows[-1]["equiv_log_odds"] - policy.equiv_log_odds(theta_old)
