"""The row glossary and the metric glossary together document exactly the simulator's row keys."""

from cancellation import METRIC_KEYS
from cancellation.glossary import METRIC_DOCS
from toymodel import ROW_KEYS, simulate
from toymodel.glossary import ROW_DOCS


def test_every_non_metric_row_key_documented_and_no_extra():
    assert set(ROW_DOCS) == set(ROW_KEYS) - set(METRIC_KEYS)
    assert not set(ROW_DOCS) & set(METRIC_DOCS)
    for key, (meaning, reference) in ROW_DOCS.items():
        assert meaning.strip() and reference.strip(), key


def test_glossaries_cover_an_actual_row():
    rows = simulate("shared_prefix", "grpo", steps=1, seed=0)
    assert set(rows[0]) == set(ROW_DOCS) | set(METRIC_DOCS)
