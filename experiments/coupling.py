"""``python -m experiments.coupling``: Table 1 of the cancellation-hypothesis paper on the small neural policy,
its conventions ranked by distance to the paper, and the exact value gaps (Fig. 5, 6, 11).

The measurements are ``instruments.coupling``'s (its docstring says what each one is); this module only
runs them at their defaults and prints the tables. The report's token-level section runs the same
functions through ``experiments.token_level``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import torch

from instruments.coupling import (
    CONVENTION_KEYS,
    MASK_SETS,
    VALUE_SCENARIOS,
    closest_to_paper,
    convention_grid,
    format_table,
    format_value_tables,
    table1,
    table_rows,
    value_gap_study,
)


def main(argv: Sequence[str] | None = None) -> None:  # pragma: no cover - printing entry point
    """Print the default Table 1, the convention grid ranked by distance, the closest reading, then the
    value-gap tables (Fig. 5, 11, 6) on ``template_task`` and on ``shared_prefix`` (choices at every step)."""
    argparse.ArgumentParser(
        prog="python -m experiments.coupling",
        description="Table 1 of the cancellation-hypothesis paper (arXiv 2605.08666) on the small neural policy, "
        "its conventions ranked by distance to the paper, and the exact value gaps (Fig. 5, 6, 11); about "
        "30 s on a 2-core CPU. No options: every convention is a parameter of instruments.coupling.table1.",
    ).parse_args(argv)
    torch.set_num_threads(1)
    res = table1()
    print(f"## Table 1, defaults ({res['scenario']}, seed {res['seed']}, update {res['update']})\n")
    print("(rates in %; paper_br: Table 1's Boost Rate in the matching column)\n")
    print(format_table(table_rows(res)))
    print(f"\nsign agreement (proxy vs full): {res['sign_agreement']}")
    print(f"coupling mass ({res['update']} kernel): {res['coupling_mass']}")
    print(f"‖K_full − K_proxy‖/‖K_full‖ = {res['kernel_rel_diff']:.3f}; params {res['n_params']}\n")
    grid = convention_grid()
    ranked = closest_to_paper(grid)
    cols = [*CONVENTION_KEYS, "seeds", *(f"br_{s}" for s in MASK_SETS), "distance_pp"]
    print("## Conventions ranked by distance to the paper's Boost Rates (seeds 0-2)\n")
    print(format_table(ranked, cols))
    best = ranked[0]
    print("\nclosest reading: " + ", ".join(f"{k}={best[k]}" for k in CONVENTION_KEYS)
          + f" ({best['distance_pp']:.1f} pp)")  # fmt: skip
    for scenario in VALUE_SCENARIOS:
        print(f"\n## Value gap (Sec. 3, App. E.2): {scenario}\n")
        print("(exact counterfactual values, eq. 20; gap = mean value of boosted − suppressed tokens, "
              "mean ± SE over seeds)\n")  # fmt: skip
        print(format_value_tables(value_gap_study(scenario)))


if __name__ == "__main__":  # pragma: no cover
    main()
