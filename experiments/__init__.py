"""Experiments of Cancellation Lab: the papers' predictions tested on the toy and the language model.

- ``stats``: per-arm bootstrap CIs, paired differences against a baseline (sign test and paired-bootstrap
  p-values), right-censored measures (steps to a threshold), report tables in markdown.
"""
