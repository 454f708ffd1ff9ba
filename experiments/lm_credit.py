"""``python -m experiments.lm_credit``: cancellation as hidden credit assignment on the tiny LM (the filter
probes and the Monte Carlo token values, arXiv 2605.08666 Sec. 3.1–3.2, App. E.1–E.2), printed as the
report's section.

The measurement is ``instruments.lm_credit``'s, which takes a saved model folder; this module adds the power
study's model as the default (``model_folder``: ``experiments.lm_power``'s template_decoy warm start, built
once) and prints the result. The report's token-level section runs the same function through
``experiments.token_level``.

    python -m experiments.lm_credit                  # the default run (the power study's model)
    python -m experiments.lm_credit --quick          # a small smoke run
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from experiments import lm, lm_power
from instruments import lm_credit
from instruments.lm_credit import markdown_lm_credit, run_lm_credit

#: The last line of the report section (``instruments.lm_credit.markdown_lm_credit``'s ``commands``).
COMMANDS_TEXT = (
    "Commands: `python -m experiments.lm_credit` (default), `python -m experiments.lm_credit --quick`; "
    "tests: `python -m pytest -q tests/experiments/test_lm_credit.py`."
)
#: Default root: the power study's folder, whose ``model`` is the template_decoy warm start.
DEFAULT_ROOT = Path("runs/experiments/power")


def model_folder(folder_or_root: str | Path) -> Path:
    """``folder_or_root`` if it is a saved model folder (has ``config.json``), else ``folder_or_root / "model"``,
    the power study's template_decoy warm start (``experiments.lm.ensure_model``; built if missing)."""
    path = Path(folder_or_root)
    if (path / "config.json").is_file():
        return path
    return lm.ensure_model(
        path / "model",
        warm_start_steps=lm_power.WARM_START_STEPS,
        stop_accuracy=None,
        settings=lm_power.MODEL_SETTINGS,
    )


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:  # pragma: no cover - printing entry point
    parser = argparse.ArgumentParser(
        prog="python -m experiments.lm_credit", description=lm_credit.__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--model",
        type=Path,
        default=DEFAULT_ROOT,
        help="a saved model folder, or a root whose model/ is the power study's warm start",
    )
    parser.add_argument("--quick", action="store_true", help="a small smoke run")
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = parser.parse_args(argv)
    result = run_lm_credit(
        model_folder(args.model), quick=args.quick, progress=lambda m: print(m, flush=True)
    )
    print(markdown_lm_credit(result, COMMANDS_TEXT))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":  # pragma: no cover
    main()
