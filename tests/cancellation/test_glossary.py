"""The metric glossary documents exactly the metric keys every objective returns."""

import torch

from cancellation import METRIC_KEYS, OBJECTIVES, compute_loss
from cancellation.glossary import METRIC_DOCS


def test_every_metric_key_documented_and_no_extra():
    assert set(METRIC_DOCS) == set(METRIC_KEYS)
    for key, (meaning, reference) in METRIC_DOCS.items():
        assert meaning.strip() and reference.strip(), key


def test_glossary_keys_are_what_compute_loss_returns():
    # the keys come from an actual call of every objective, not from METRIC_KEYS
    logp = torch.log(torch.tensor([[0.5, 0.4], [0.3, 0.6]], dtype=torch.float64))
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    mask, group = torch.ones(2, 2), torch.zeros(2, dtype=torch.long)
    for name in OBJECTIVES:
        _, metrics = compute_loss(name, logp, logp - 0.1, adv, mask, group)
        assert set(metrics) == set(METRIC_DOCS), name
