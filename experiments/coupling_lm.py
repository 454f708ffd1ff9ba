"""``python -m experiments.coupling_lm``: Table 1 of the cancellation-hypothesis paper on the tiny Qwen3 (the
full, tied-head and untied-head updates, and the output-layer proxy), printed as the report's section.

The measurements are ``instruments.coupling_lm``'s, which take a saved model folder; this module adds the
power study's model as the default (``default_model``: ``experiments.lm_power``'s template_decoy warm start,
built once) and prints the result. The report's token-level section runs the same functions through
``experiments.token_level``.

    python -m experiments.coupling_lm [--model FOLDER] [--seeds 0 1] [--quick] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from experiments import lm_power
from experiments.lm import ensure_model
from instruments import coupling_lm
from instruments.coupling_lm import DEFAULT_SEEDS, lm_table1, markdown_lm_table1

#: The default model's root: ``experiments.lm_power``'s, so its warm-start model is reused.
DEFAULT_ROOT = Path("runs/experiments/power")


def default_model(root: str | Path = DEFAULT_ROOT, progress: Callable[[str], Any] | None = print) -> Path:
    """The template_decoy warm-start model of ``experiments.lm_power`` in ``root / "model"`` (built once)."""
    return ensure_model(
        Path(root) / "model", warm_start_steps=lm_power.WARM_START_STEPS, stop_accuracy=None,
        settings=lm_power.MODEL_SETTINGS, progress=progress,
    )  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:  # pragma: no cover - printing entry point
    """Print the markdown section of ``lm_table1`` (``--quick``: one seed, one prompt, 8 exact candidates)."""
    parser = argparse.ArgumentParser(
        prog="python -m experiments.coupling_lm", description=coupling_lm.__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--model", default=None, help="a saved model folder (default: experiments.lm_power's)"
    )
    parser.add_argument(
        "--seeds", type=int, nargs="+", default=None, help=f"batch seeds (default {DEFAULT_SEEDS})"
    )
    parser.add_argument("--quick", action="store_true", help="one seed, one prompt, 8 exact candidates")
    parser.add_argument("--json", default=None, help="also write the result as JSON here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    kw: dict[str, Any] = {"num_prompts": 1, "n_candidates": 8} if args.quick else {}
    seeds = args.seeds if args.seeds is not None else ((0,) if args.quick else DEFAULT_SEEDS)
    t0 = time.perf_counter()

    def progress(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:6.1f} s] {msg}")

    folder = default_model(progress=progress) if args.model is None else args.model
    res = lm_table1(folder, seeds=seeds, progress=progress, **kw)
    print()
    print(markdown_lm_table1(res))
    print(f"\n({res['seconds']:.0f} s in all; per seed: "
          + ", ".join(f"{p['seed']}: {p['seconds']['total']:.0f} s" for p in res["per_seed"]) + ")")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":  # pragma: no cover
    main()
