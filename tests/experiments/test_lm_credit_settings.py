"""``instruments.lm_credit.CreditSettings``: the settings of ``run_lm_credit``, their mode defaults and the
keyword API built on them (no model needed: the settings are checked before any model is loaded)."""

from __future__ import annotations

import dataclasses

import pytest

from instruments.lm_credit import CreditSettings, run_lm_credit

#: ``run_lm_credit``'s keyword settings before it took a ``CreditSettings`` (issue 32): each is still a
#: keyword of ``run_lm_credit`` (``experiments.token_level`` and the tests call it that way).
KEYWORDS = (
    "quick", "task", "reward", "num_prompts", "group_size", "seed", "max_new_tokens", "temperature", "lr",
    "n_tokens", "k", "max_prob", "n_steps", "repeat", "top_fracs", "budget_group_sizes", "budget_num_prompts",
    "budget_seeds", "budget_n_tokens", "budget_k", "top_k", "chunk_rows",
)  # fmt: skip


def test_every_former_keyword_is_a_setting():
    assert {f.name for f in dataclasses.fields(CreditSettings)} == set(KEYWORDS)


@pytest.mark.parametrize("seed", [0, 5])
def test_mode_defaults(seed):
    # the defaults run_lm_credit's docstring states: full (quick)
    full = CreditSettings(seed=seed).resolved()
    quick = CreditSettings(quick=True, seed=seed).resolved()
    assert (full.n_tokens, full.k, full.n_steps, full.budget_n_tokens, full.budget_k) == (48, 64, 5, 32, 32)
    assert (quick.n_tokens, quick.k, quick.n_steps, quick.budget_n_tokens, quick.budget_k) == (8, 8, 2, 8, 8)
    assert (full.budget_group_sizes, full.budget_num_prompts) == ((4, 8, 16), (1, 2, 4))
    assert (quick.budget_group_sizes, quick.budget_num_prompts) == ((4, 8), (1, 2))
    assert full.budget_seeds == (seed, seed + 1) and quick.budget_seeds == (seed,)
    # resolving twice changes nothing; a given value is kept in either mode
    assert full.resolved() == full
    given = CreditSettings(quick=True, n_tokens=3, k=5, budget_seeds=[7, 9], budget_group_sizes=(2,))
    got = given.resolved()
    assert (got.n_tokens, got.k, got.budget_seeds, got.budget_group_sizes) == (3, 5, (7, 9), (2,))
    assert got.record()["budget_seeds"] == [7, 9] and got.record()["quick"] is True


def test_an_unknown_setting_is_named(tmp_path):
    with pytest.raises(TypeError, match="budget_seed") as info:
        run_lm_credit(tmp_path, quick=True, budget_seed=(1,))
    assert "budget_seeds" in str(info.value)  # the valid names are listed
