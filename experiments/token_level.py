"""The report's token-level section: the cancellation hypothesis' instruments on the neural toy and the tiny Qwen3.

The paper: "The Cancellation Hypothesis in Critic-Free RL: From Outcome Rewards to Token Credits"
(arXiv 2605.08666). Four measurements, each its own module's, collected here into one JSON file and one
section of ``experiments/REPORT.md``:

- ``toy_table1``: Table 1 on the small neural policy (``instruments.coupling``): the default reading for
  the Full and LM-head columns, and the convention grid ranked by distance to the paper's Boost Rates;
- ``toy_values``: Fig. 5 / 6 / 11's value gap with the *exact* counterfactual token values of the toy
  (``instruments.coupling.value_gap_study``);
- ``lm_table1``: Table 1, the tied vs untied LM head and the proxy on the tiny Qwen3
  (``instruments.coupling_lm``);
- ``lm_credit``: cancellation as filter (positive-only / negative-only / GRPO from one checkpoint) and the
  Monte Carlo counterfactual value on the tiny Qwen3 (``instruments.lm_credit``).

``python -m experiments --only coupling`` runs them (about 5 min on a 2-core CPU, plus 2 min to build the
tiny model the first time; ``--quick`` a smaller slice) and saves ``<results>/token_level/token_level.json``; the report renders whatever is saved there
(``--report-only`` included). The file lives in a subfolder because the report reads every ``*.json`` of
the results folder itself as a study.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

#: Where the results live, relative to the results folder (a subfolder: see the module docstring).
RESULT_FILE = Path("token_level") / "token_level.json"

#: The commands that reproduce each part on its own (printed in the report).
COMMANDS = {
    "toy_table1": "python -m experiments.coupling",
    "toy_values": "python -m experiments.coupling",
    "lm_table1": "python -m experiments.coupling_lm",
    "lm_credit": "python -m experiments.lm_credit",
}
PARTS = tuple(COMMANDS)


REPO = Path(__file__).resolve().parents[1]


def _clean(x: Any) -> Any:
    """JSON-safe: tensors to lists/floats, tuples to lists, NaN kept (json writes NaN), paths inside the
    repository relative to it (so the saved results read the same on every clone)."""
    if isinstance(x, str) and x.startswith(str(REPO) + "/"):
        return x[len(str(REPO)) + 1 :]
    if isinstance(x, torch.Tensor):
        return x.tolist()
    if isinstance(x, Mapping):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


TOY_VALUES_TEXT = (
    "Every token of one on-policy batch of the neural policy gets its *exact* counterfactual value "
    "(eq. 20's target Q(s, a) − E[R | s, not a], by enumerating the toy's support: "
    "`toymodel.values.exact_token_values`); a token is boosted or suppressed by the sign of its Δ log π after "
    "one plain SGD step of GRPO (`cancellation.coupling.value_gap`); mean ± SE over seeds. The paper's claims: "
    "boosted tokens have the higher value (Fig. 5a), the gap peaks at about the top 40 % by entropy (5b), "
    "grows with repeated updates on the batch (11) and with the sampling budget (6). A token of a positive "
    "rollout is boosted by its own coefficient too, so part of the gap needs no cancellation at all: the "
    "*self-only* row is that control (each token moved by its own term lr·c_j·K_jj alone, so boosted = the "
    "tokens of positive rollouts), and *what coupling adds* the paired difference.\n"
)


def _pm(st: Mapping[str, Any]) -> str:
    return f"{st['mean']:+.3f} ± {st['se']:.3f}"


def toy_values_summary(res: Mapping[str, Any]) -> str:
    """Sentences read off one ``value_gap_study`` result: the sign of each figure's claim, with its numbers."""
    a = res["fig5a"]["all"]["gap"]
    b = {float(k): v["mean"] for k, v in res["fig5b"].items()}
    peak = max(b, key=lambda k: b[k])
    steps = sorted(res["fig11"], key=int)
    first, last = res["fig11"][steps[0]], res["fig11"][steps[-1]]
    gs = [r for r in res["fig6"] if r["axis"] == "group_size"]
    lo, hi = gs[0], gs[-1]
    control = (
        f", of which the no-coupling control (each token moved by its own coefficient alone) gives "
        f"{_pm(res['self_only'])} and coupling adds {_pm(res['coupling_adds'])}; within negative rollouts, "
        f"where the control boosts nothing, the coupled step's gap is {_pm(res['fig5a']['negative']['gap'])}"
        if "self_only" in res
        else ""
    )
    return (
        f"On `{res['scenario']}`: boosted − suppressed {_pm(a)}{control} (5a); the largest top-k gap at the top "
        f"{100 * peak:.0f} % by entropy ({b[peak]:+.3f}, all tokens {b[1.0]:+.3f}) (5b); after "
        f"{steps[0]} and {steps[-1]} steps {_pm(first)} and {_pm(last)} (11); at group size {lo['group_size']} "
        f"and {hi['group_size']} {_pm(lo['gap'])} and {_pm(hi['gap'])} (6).\n"
    )


def toy_table1(*, quick: bool = False) -> dict[str, Any]:
    """Table 1 on the neural toy: the default reading (Full and LM-head) and the convention grid's ranking."""
    from instruments.coupling import closest_to_paper, convention_grid, table1

    seeds = (0,) if quick else (0, 1, 2)
    default = {u: table1(update=u) for u in ("full", "head")}
    ranked = closest_to_paper(convention_grid(seeds=seeds))
    return {"default": default, "ranked": ranked, "seeds": list(seeds)}


def run_token_level(
    out: str | Path,
    root: str | Path,
    *,
    quick: bool = False,
    model: str | None = None,
    parts: tuple[str, ...] = PARTS,
    progress: Callable[[str], Any] | None = print,
) -> dict[str, Any]:
    """Run ``parts`` and save them to ``out / RESULT_FILE`` after each one (a crash keeps what finished);
    the saved results of other parts (of the same mode) are kept.

    ``root``: the folder of the tiny model (built there once, reused); ``model``: another saved model
    folder for the LM parts instead.
    """
    say = progress or (lambda _m: None)
    unknown = set(parts) - set(PARTS)
    if unknown:
        raise ValueError(f"unknown part(s) {sorted(unknown)}; valid: {', '.join(PARTS)}")
    path = Path(out) / RESULT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = "quick" if quick else "full"
    # the parts not run now keep their saved results (a crashed or partial run resumes part by part)
    result: dict[str, Any] = {"mode": mode, "seconds": {}}
    saved = load(out)
    if saved is not None and saved.get("mode") == mode:
        result = saved
    torch.set_num_threads(1)
    model_dir: str | None = model
    for part in parts:
        t0 = time.perf_counter()
        say(f"token-level: {part} ...")
        if part == "toy_table1":
            result[part] = toy_table1(quick=quick)
        elif part == "toy_values":
            from instruments.coupling import VALUE_SCENARIOS, value_gap_study

            studies = {sc: value_gap_study(sc, quick=quick) for sc in VALUE_SCENARIOS}
            result[part] = {sc: {k: v for k, v in r.items() if k != "per_seed"} for sc, r in studies.items()}
        else:
            if model_dir is None:
                from .lm import ensure_model
                from .lm_power import MODEL_SETTINGS, WARM_START_STEPS

                model_dir = str(ensure_model(Path(root) / "model", warm_start_steps=WARM_START_STEPS,
                                             stop_accuracy=None, settings=MODEL_SETTINGS, progress=say))  # fmt: skip
            if part == "lm_table1":
                from instruments.coupling_lm import lm_table1

                quick_kw: dict[str, Any] = (
                    {"seeds": (0,), "num_prompts": 1, "n_candidates": 8} if quick else {}
                )
                result[part] = lm_table1(model_dir, **quick_kw)
            else:
                from instruments.lm_credit import run_lm_credit

                result[part] = run_lm_credit(model_dir, quick=quick)
        result["seconds"][part] = time.perf_counter() - t0
        path.write_text(json.dumps(_clean(result), indent=1))
        say(f"token-level: {part} {result['seconds'][part]:.0f} s")
    return result


def _demote(md: str, levels: int = 1) -> str:
    """``md`` with every heading ``levels`` deeper (a module's own section nested in this one)."""
    return "\n".join("#" * levels + line if line.startswith("#") else line for line in md.splitlines())


def load(out: str | Path) -> dict[str, Any] | None:
    """The saved token-level results in the results folder ``out``, or None."""
    path = Path(out) / RESULT_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def markdown(result: Mapping[str, Any]) -> str:
    """The report section for ``result`` (the parts that are there)."""
    from instruments.coupling import CONVENTION_KEYS, MASK_SETS, format_table, table_rows

    parts = [
        "## Token-level instruments: the cancellation hypothesis\n",
        "The cancellation-hypothesis paper (arXiv 2605.08666) explains which tokens a group-relative update "
        "moves through the coupling kernel K_jk = ⟨∇log π(y_j), ∇log π(y_k)⟩ (eq. 5), measures it with the "
        "Masking Effect of Table 1, and argues that the update works as an advantage-weighted filter whose "
        "survivors carry higher counterfactual value (Sec. 3, App. E). Its text lost the typeset equations; "
        "`cancellation/coupling.py` rebuilds each from the prose around its number. These are measurements "
        "of one batch at a time, not predictions decided by seeds: they sit outside the Holm family above.\n",
    ]
    secs = result.get("seconds", {})
    if "toy_table1" in result:
        t = result["toy_table1"]
        parts.append("### Table 1 on the small neural policy\n")
        parts.append(
            "One on-policy batch of a one-hidden-layer net with an untied unembedding on `template_task` "
            "(4 groups of 8, GRPO token-mean coefficients, one plain SGD step at lr 1; `toymodel.neural`). "
            'Default reading (candidates: every movable token whose "both" set is non-empty, '
            "`candidate_filter='coupled'`, so each mask set is scored on the same tokens; masks of either sign, "
            "threshold 0.5, ME not oriented); rates in %, `paper_br` the paper's Table 1 column:\n"
        )
        for u, res in t["default"].items():
            parts.append(f"**{'Full' if u == 'full' else 'LM-head'} update** (seed {res['seed']}):\n")
            parts.append(format_table(table_rows(res)) + "\n")
        best = t["ranked"][0]
        cols = [*CONVENTION_KEYS, *(f"br_{s}" for s in MASK_SETS), "distance_pp"]
        parts.append(
            f"The paper leaves the candidates, the masks' sign, the orientation of ME and the update open; "
            f"the grid over them (seeds {', '.join(map(str, t['seeds']))}), the five readings closest to the "
            "paper's Boost Rates (mean absolute difference in points):\n"
        )
        parts.append(format_table(t["ranked"][:5], cols) + "\n")
        parts.append(
            "Closest reading: " + ", ".join(f"{k} = {best[k]}" for k in CONVENTION_KEYS)
            + f", {best['distance_pp']:.1f} points from the paper's column.\n"
        )  # fmt: skip
    if "toy_values" in result:
        from instruments.coupling import format_value_tables

        parts.append("### Counterfactual value on the toy (exact)\n")
        parts.append(TOY_VALUES_TEXT)
        for res in result["toy_values"].values():
            parts.append(toy_values_summary(res))
            parts.append(format_value_tables(res) + "\n")
    if "lm_table1" in result:
        from instruments.coupling_lm import markdown_lm_table1

        parts.append(_demote(markdown_lm_table1(result["lm_table1"])) + "\n")
    if "lm_credit" in result:
        from instruments.lm_credit import markdown_lm_credit

        from .lm_credit import COMMANDS_TEXT as LM_CREDIT_COMMANDS

        parts.append(_demote(markdown_lm_credit(result["lm_credit"], LM_CREDIT_COMMANDS)) + "\n")
    cmds = sorted({COMMANDS[p] for p in PARTS if p in result})
    total = sum(float(v) for v in secs.values())
    parts.append(
        f"_Produced by `python -m experiments --only coupling` ({result.get('mode', 'full')} mode, "
        f"{total / 60:.1f} min); each part alone: {', '.join(f'`{c}`' for c in cmds)}._\n"
    )
    return "\n".join(parts).replace(str(REPO) + "/", "")


__all__ = ["COMMANDS", "PARTS", "RESULT_FILE", "load", "markdown", "run_token_level", "toy_table1"]
