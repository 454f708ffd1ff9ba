"""Token-level instruments of the cancellation-hypothesis paper (arXiv 2605.08666), shared by the app, the
tutorials and the report's token-level section.

- ``instruments.coupling``: Table 1 (the Masking Effect and its Boost Rates) and the exact value gaps
  (Fig. 5, 6, 11) on the small neural policy ``toymodel.neural.NeuralPolicy``;
- ``instruments.coupling_lm``: the same Table 1 on a causal LM's batch (the tiny Qwen3 or any saved model
  folder), under the full, tied-head and untied-head updates.
- ``instruments.lm_credit``: cancellation as hidden credit assignment on a causal LM (the filter probes of
  App. E.1 and the Monte Carlo token values of App. E.2, Fig. 5, 6, 11).

They measure one batch at a time and take a model folder; ``experiments`` runs them at the report's
settings (``experiments.token_level``) and builds the default model (``experiments.coupling_lm``,
``experiments.lm_credit``).
"""
