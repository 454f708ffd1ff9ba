"""Page 8, About / glossary: what the project is, what each number means, where it comes from.

The glossaries are ``cancellation.glossary.METRIC_DOCS``, ``METER_DOCS`` (the cancellation meters the toy
and the trainer both log) and ``toymodel.glossary.ROW_DOCS`` (the other simulator rows), each key:
meaning and paper equation; ``ESTIMATOR_DOCS`` says what each estimator of gspo/dfpo differentiates. The
objectives table lists every registered objective (a test checks it against ``cancellation.OBJECTIVES``);
the tutorials are the jupytext ``.py`` notebooks found in
``tutorials/`` at run time, each with the first line of its first markdown cell.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import streamlit as st

from app.common import page_header
from cancellation.glossary import ESTIMATOR_DOCS, METER_DOCS, METRIC_DOCS
from cancellation.objectives import OBJECTIVES, default_params
from toymodel.glossary import ROW_DOCS
from toymodel.simulate import ROW_KEYS

#: the repository's tutorials folder (this file is app/views/about.py)
TUTORIALS_DIR = Path(__file__).resolve().parents[2] / "tutorials"


def objective_defaults(name: str) -> str:
    """Objective ``name``'s defaults as the table shows them: its parameters' (``cancellation.params``, the
    dataclass the loss reads) and its aggregation (the loss's own)."""
    aggregation = inspect.signature(OBJECTIVES[name]).parameters["aggregation"].default
    return ", ".join([*(f"{k}={v}" for k, v in default_params(name).items()), f"aggregation={aggregation}"])


#: the objectives of ``cancellation.compute_loss``: name, per-token term, paper, defaults (README.md)
OBJECTIVE_ROWS = [
    {
        "objective": "grpo",
        "per-token term (before aggregation)": "min(r·A, clip(r, 1−ε_low, 1+ε_high)·A)",
        "paper": "GRPO, DAPO clip-higher; DFPO eq. (77)",
        "defaults": objective_defaults("grpo"),
    },
    {
        "objective": "grpo_symclip",
        "per-token term (before aggregation)": "A·clip(r, 0, 1+ε)",
        "paper": "GRPO-fix, DFPO App. H eq. (79)–(80)",
        "defaults": objective_defaults("grpo_symclip"),
    },
    {
        "objective": "gspo",
        "per-token term (before aggregation)": (
            "min(s·A, clip(s)·A), s = exp(mean_t log r) (length_norm=False: s = Π r, eq. 11), broadcast to the "
            "sequence's tokens"
        ),
        "paper": 'DFPO eq. (42)–(44); estimator="paper": eq. (86)',
        "defaults": objective_defaults("gspo"),
    },
    {
        "objective": "dfpo",
        "per-token term (before aggregation)": (
            "value A·s̃, gradient s̃·A·∇log s (s̃ = transform(s̄) a constant, s̄ the sign-aware post-clip weight)"
        ),
        "paper": "DFPO eq. (16), (47), (50), (18), (51), (52)–(55), (68), (91)",
        "defaults": objective_defaults("dfpo"),
    },
]

#: DFPO's group transforms (``cancellation.TRANSFORMS``): name, what it does, paper
TRANSFORM_ROWS = [
    {
        "transform": "min_replace",
        "what it does": "every weight of the group becomes the group's smallest s̄",
        "paper": "DFPO eq. (17), (50)",
    },
    {
        "transform": "orth_proj",
        "what it does": "removes the component of s̄ along Â: s̃ = s̄ − (Âᵀs̄ / ‖Â‖²)·Â",
        "paper": "DFPO eq. (18)",
    },
    {
        "transform": "orth_proj_pos",
        "what it does": "the closest s̃ ≥ 0 with Σ Â s̃ = 0 (exact QP)",
        "paper": "DFPO eq. (51)",
    },
    {
        "transform": "truncate_rebalance",
        "what it does": "floors the weights at a small ε > 0, then scales one sign side so Σ Â s̃ = 0",
        "paper": "DFPO eq. (52)–(55)",
    },
]

_MARKDOWN_CELL = re.compile(r"^#\s*%%.*\[markdown\]")
_CELL = re.compile(r"^#\s*%%")


def tutorial_description(path: Path) -> str:
    """The first non-empty line of the first markdown cell of a jupytext percent ``.py`` notebook.

    Heading marks are removed (``# # Title`` gives ``Title``). Without a markdown cell: the first line
    of the module docstring, else "(no description)".
    """
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    in_markdown = False
    for line in lines:
        if _MARKDOWN_CELL.match(line):
            in_markdown = True
            continue
        if in_markdown:
            if _CELL.match(line) or not line.startswith("#"):
                in_markdown = False  # the markdown cell ended without a non-empty line
                continue
            text = line[1:].strip().lstrip("#").strip()  # the comment mark, then heading marks
            if text:
                return text
    for line in lines:
        stripped = line.strip()
        if stripped.startswith(('"""', "'''")):
            text = stripped.strip("\"'").strip()
            return text or "(no description)"
        if stripped and not stripped.startswith("#"):
            break
    return "(no description)"


def tutorial_entries(folder: Path) -> list[tuple[str, str]]:
    """(file name, description) of every jupytext ``.py`` notebook in ``folder``, sorted by name."""
    if not folder.is_dir():
        return []
    files = sorted(p for p in folder.glob("*.py") if p.is_file() and not p.name.startswith("_"))
    return [(p.name, tutorial_description(p)) for p in files]


def _glossary_table(
    keys: list[str], docs: dict[str, tuple[str, str]], first: str = "metric"
) -> list[dict[str, str]]:
    return [{first: k, "meaning": docs[k][0], "equation": docs[k][1]} for k in keys]


page_header(
    "About / glossary",
    "What is Cancellation Lab, what does each number on these pages mean, and which equation is it from?",
    r"\frac{1}{G}\sum_{i=1}^{G}\widehat{A}_{i}\,\nabla_{\theta}\,\omega_{i,t^{\star}} = \mathbf{0}",
    "DFPO eq. (2): the cancellation condition. For a token t* that every completion of a group shares, "
    "the advantage-weighted sum of its gradients must vanish.",
)

st.markdown(
    """
Group-relative RL (GRPO, GSPO, DAPO, ...) trains reasoning models from one reward per completion.
Tokens that the good and bad completions of one prompt **share** should receive gradients that
**cancel**. Common objectives break that cancellation (sequence-coupled weights, sign-asymmetric
clipping, split groups, unbalanced batches, low-probability tokens that dominate). The leftover drift
shows up as a *learning tax* and as entropy collapse between equally good answers.

Cancellation Lab implements that theory and its fixes: DFPO's group transforms, GRPO-fix symmetric
clipping, query-preserved and reward-balanced batching, Advantage Reweighting and Lopti, and the
diagnostics that measure cancellation directly. The math is written once, in `cancellation/` (pure
torch). The tabular toy in `toymodel/` reproduces the papers' toy problems exactly, and every number
on these pages is computed by those two packages.

| page | question |
|---|---|
| Shared prefix | Why does sequence coupling leave a net gradient on a shared prefix (App. A.2, eq. 38)? |
| Clipping asymmetry | When does GRPO's clipping stop shared tokens from cancelling, and does GRPO-fix restore it (App. F/H)? |
| Group transforms | What do DFPO's transforms do to a group's weights, and do they reach Σ Â s̃ = 0 (App. B)? |
| Training lab | How do the objectives compare in training: reward, entropy, learning tax, residuals? GSPO vs the eq. (86) control vs DFPO tells the estimator's effect from the transform's. |
| Low-probability tokens | Why do low-probability tokens dominate the gradient, and what does Advantage Reweighting change? |
| Token coupling | How much does one SGD step move each token through the others (the coupling kernel, eq. 5, and its output-layer proxy, eq. 7), what does masking a token set do (Table 1's Boost Rate), and do the boosted tokens have higher value (Fig. 5)? |
| Runs | Did the language-model runs of `scaledrun` learn, and did their shared-token gradients cancel? |
"""
)

st.header("Objectives")
st.caption(
    "`cancellation.compute_loss(name, logp, old_logp, advantages, mask, group, **params)`; loss = −objective. "
    "r = π_θ/π_old per token, s the sequence ratio, A (Â) the group-relative advantage."
)
st.table(OBJECTIVE_ROWS, hide_index=True)
st.markdown("DFPO's group transforms (`dfpo`'s `transform=`), each applied per group with a stop-gradient:")
st.table(TRANSFORM_ROWS, hide_index=True)
st.markdown(
    "What is differentiated (`estimator=`, `stop_grad=`). GSPO → the eq. (86) control is what the paper's "
    "estimator does, the control → DFPO what the transform does:"
)
st.table(_glossary_table(list(ESTIMATOR_DOCS), ESTIMATOR_DOCS, "estimator"), hide_index=True)

st.header("Glossary")
st.subheader("Objective metrics")
st.caption(
    "Returned by every objective of `cancellation.compute_loss`; the same keys in the toy's rows and the "
    "trainer's logs. Equations are the DFPO paper's unless named; docs/papers.md lists the papers."
)
metric_keys = [k for k in ROW_KEYS if k in METRIC_DOCS] + [k for k in METRIC_DOCS if k not in ROW_KEYS]
st.table(_glossary_table(metric_keys, METRIC_DOCS), hide_index=True)
st.subheader("Cancellation meters")
st.caption(
    "`cancellation.update.CancellationMeter`: the toy's rows and the trainer's metrics.jsonl carry the same "
    "keys, read from the coefficients ∂J/∂logp that each optimiser step of the step applied."
)
st.table(_glossary_table(list(METER_DOCS), METER_DOCS), hide_index=True)
st.subheader("Simulator rows")
st.caption(
    "One row per step of `toymodel.simulate` (plus the metrics and meters above). "
    "Papers other than DFPO are named where cited; docs/papers.md lists them."
)
row_keys = [k for k in ROW_KEYS if k in ROW_DOCS and k not in METER_DOCS]
st.table(_glossary_table(row_keys, ROW_DOCS), hide_index=True)

st.header("Tutorials")
tutorials = tutorial_entries(TUTORIALS_DIR)
if not tutorials:
    st.info(
        "The tutorials are not written yet. They will be step-through notebooks in `tutorials/` "
        "(jupytext `.py` files) and will be listed here."
    )
else:
    st.markdown(
        "Step-through notebooks, kept as jupytext percent `.py` files: open one in Jupyter (with jupytext) "
        "or run it as a script, e.g. `.venv/bin/python tutorials/<file>.py`."
    )
    st.markdown("\n".join(f"- `tutorials/{name}`: {description}" for name, description in tutorials))
