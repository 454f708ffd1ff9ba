"""Experiments of Cancellation Lab: the papers' predictions tested on the toy and the language model.

- ``claims``: the papers' claims the studies test, each written once (``CLAIMS``), bound into predictions.
- ``toy``: the toy studies' runner: arms trained on the tabular toy over paired seeds, per-seed measures.
- ``toy_studies``: the toy studies declared (arms, sizes, measures, predictions) and the commands that run them.
- ``frontier``: ``toy_frontier``, every main arm at its own best step size.
- ``lm``: the language-model sweep's runner (one run folder per (arm, seed), the real trainer) and measures.
- ``lm_studies``: the sweep declared (arms, grid sizes, predictions, limits).
- ``lm_power``: the language-model study with power: each arm at its own learning rate, 30 fresh seeds.
- ``lm_residual``: DFPO Min-Replace against the eq. 86 control where the control's residual is large.
- ``study``: one study's results as data (arms, per-seed measures, curves, predictions), saved as JSON.
- ``stats``: per-arm bootstrap CIs, paired differences against a baseline (paired t, sign test, sign-flip and
  bootstrap p-values), Holm and Benjamini-Hochberg adjustments, right-censored measures, markdown tables.
- ``report``: the saved results → ``REPORT.md`` (tables, verdicts, figures), without running anything.
- ``token_level``: the report's token-level section, the ``instruments`` measurements collected into one file.
- ``coupling``, ``coupling_lm``, ``lm_credit``: the command lines of those measurements
  (``python -m experiments.coupling`` ...), printed as the report's sections.
"""
