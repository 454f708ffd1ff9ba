"""The trainer's update: exact micro-batching for every objective, and the cancellation meter's invariants.

- Micro-batches of 1, 3 and the whole mini-batch give the same gradient and the same metrics and meter
  sums, for every objective, DFPO transform, estimator and several aggregations, off-policy (ratios away
  from 1, some sequences clipped) so that the transforms act. These run the model and the batch in
  float64 and compare at 1e-9 of the sums' magnitude (``tests/exactness.py``: in float32 the passes sum
  in another order on every CPU). A loss computed micro-batch
  by micro-batch (the trainer's old accumulation) is checked to give a different gradient there.
- ``sequence_net_residual`` at float32 rounding (``RESIDUAL_TOL``) under DFPO's paper estimator with every transform, through the real
  loop: default clip range with 2 inner epochs (clipped sequences), 2 mini-batches, micro-batches and
  truncated completions; it is clearly > 0 under DFPO's ``ppo_clip`` variant and under GRPO token-mean
  with unequal lengths. The two-process run is in ``test_multiprocess.py``.
"""

from __future__ import annotations

import pytest
import torch

import scaledrun.train as tr
from cancellation import compute_loss
from cancellation.transforms import TRANSFORMS
from scaledrun.config import RunConfig
from scaledrun.model import load_model_and_tokenizer

from ..exactness import FLOAT64_RTOL, as_float64, close, max_abs_err, rounding_tolerance
from .test_train import (
    TRUNCATED_LENGTHS,
    _flat,
    _own_logp,
    _RecordingOptimizer,
    _rollout,
    make_cfg,
    replay_dir,
)

#: (objective, its config fields): every objective, both gspo estimators, the four DFPO transforms
#: (paper estimator), the ppo_clip variant and Table 3's no-stop-grad ablation. ε 0.03 with ratios in
#: about [0.94, 1.06] clips some sequences (tokens) and leaves others in the band.
OBJECTIVES = [
    ("grpo", {"epsilon_low": 0.03, "epsilon_high": 0.03}),
    ("grpo_symclip", {"epsilon": 0.03}),
    ("gspo", {"epsilon_low": 0.03, "epsilon_high": 0.03}),
    ("gspo", {"epsilon_low": 0.03, "epsilon_high": 0.03, "estimator": "paper"}),
    *[("dfpo", {"epsilon_low": 0.03, "epsilon_high": 0.03, "transform": t}) for t in TRANSFORMS],
    ("dfpo", {"epsilon_low": 0.03, "epsilon_high": 0.03, "transform": "orth_proj", "estimator": "ppo_clip"}),
    ("dfpo", {"epsilon_low": 0.03, "epsilon_high": 0.03, "transform": "orth_proj", "stop_grad": False}),
]
AGGREGATIONS = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]


def _id(variant):
    objective, params = variant
    return "-".join([objective, *(str(v) for k, v in params.items() if not k.startswith("epsilon"))])


@pytest.fixture(scope="module")
def setup(tiny_model, tmp_path_factory):
    """One model (weights never change: a recording optimizer) and one off-policy batch of 2 groups of 4,
    both in float64 (``tests/exactness.py``).

    The completions are chosen (``test_train._rollout``: unequal lengths, padding, a truncated row), not
    sampled, so the batch is the same on every machine; only its log-probs come from the model.
    """
    return _float64_setup(tiny_model, tmp_path_factory.mktemp("mb"))


def _float64_setup(tiny_model, root, **kw):
    from accelerate import Accelerator

    cfg = make_cfg(tiny_model, root, grad_clip=None, **kw)
    model, tokenizer = load_model_and_tokenizer(cfg)
    model.double()  # scored in float64 too (scaledrun.scoring follows the model's dtype)
    batch, _ = _rollout(cfg, model, tokenizer)
    batch = as_float64(batch)
    model.train()
    assert batch.old_logp.dtype == torch.float64
    assert len(batch) == 8 and len(set(batch.completion_mask.sum(1).tolist())) > 1  # unequal lengths
    # π_old off the current policy by a per-row shift: sequence ratios exp(δ_i), δ_i ∈ [−0.06, 0.06]
    delta = torch.tensor([0.06, -0.04, 0.01, -0.06, 0.05, -0.02, 0.03, -0.05], dtype=torch.float64)
    batch.old_logp = (batch.old_logp - delta[:, None]) * batch.completion_mask
    batch.advantages = ADVANTAGES.clone()
    return cfg, Accelerator(cpu=True), model, batch


#: The setup's advantages, zero-sum in each group of 4.
ADVANTAGES = torch.tensor([1.2, -0.3, 0.5, -1.4, -0.9, 1.1, 0.6, -0.8], dtype=torch.float64)


def _same_update(res, whole, g, g_whole, where):
    """Two updates that must agree: gradient, metrics, meter sums and energy shares, in float64."""
    err = max_abs_err(g, g_whole)
    assert err <= FLOAT64_RTOL * float(g_whole.abs().max()), (*where, err)
    assert res.metrics.keys() == whole.metrics.keys() and whole.metrics
    for key, value in whole.metrics.items():  # means of terms of order 1
        assert close(res.metrics[key], value, gross=1.0), (*where, key, res.metrics[key], value)
    # the meter: (net, gross) pairs; a net that cancels is compared at its gross sum's scale
    got, want = res.meter.as_list(), whole.meter.as_list()
    for k in range(0, len(want), 2):
        gross = max(want[k + 1], got[k + 1])
        assert close(got[k], want[k], gross=gross) and close(got[k + 1], want[k + 1]), (*where, k, got, want)
    for key, value in whole.energy.items():
        assert close(res.energy[key], value, gross=1.0), (*where, key)


def _update(setup, micro_batch_size, objective, params, aggregation):
    cfg, accelerator, model, batch = setup
    cfg = RunConfig(**{
        **cfg.__dict__, "objective": objective, "aggregation": aggregation, "micro_batch_size": micro_batch_size,
        **params,
    })  # fmt: skip
    recorder = _RecordingOptimizer(model)
    res = tr.update(
        cfg, accelerator, model, recorder, batch, batch.advantages, torch.Generator().manual_seed(0)
    )
    assert res.opt_steps == len(recorder.steps) == 1
    return res, _flat(recorder.steps[0])


@pytest.mark.exactness
@pytest.mark.parametrize(("objective", "params"), OBJECTIVES, ids=[_id(v) for v in OBJECTIVES])
def test_micro_batches_give_the_one_pass_gradient(setup, objective, params):
    for aggregation in AGGREGATIONS:
        whole, g_whole = _update(setup, 0, objective, params, aggregation)
        if params.get("stop_grad") is False and aggregation == "seq-mean-token-mean":
            # Table 3's ablation: Σ_i Â_i·T(s̄)_i = 0 for every θ, so the sequence mean has no gradient
            assert float(g_whole.abs().max()) < 1e-9
        else:
            assert float(g_whole.abs().max()) > 0, aggregation
        for size in (1, 3):  # 3 splits the first group of 4 across two micro-batches
            res, g = _update(setup, size, objective, params, aggregation)
            _same_update(res, whole, g, g_whole, (aggregation, size))


def test_the_old_per_micro_batch_loss_is_not_the_gradient(setup):
    """Why the coefficients come first: the loss of each micro-batch alone (with the global counts, as
    the trainer used to accumulate it) transforms partial groups and misses the one-pass gradient."""
    _, _, model, batch = setup
    params = {"epsilon_low": 0.03, "epsilon_high": 0.03, "transform": "orth_proj"}
    _, exact = _update(setup, 3, "dfpo", params, "seq-mean-token-mean")
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    model.zero_grad(set_to_none=True)
    mask, n_seq = batch.completion_mask, float(len(batch))
    for rows in torch.arange(len(batch)).split(3):
        sub = batch.select(rows)
        logp, _ = _own_logp(model, sub)
        loss, _ = compute_loss(
            "dfpo", logp, sub.old_logp, sub.advantages, sub.completion_mask, sub.group, seq_count=n_seq,
            token_count=float(mask.sum()), **params,
        )  # fmt: skip
        loss.backward()
    naive = _flat({n: p.grad.detach().clone() for n, p in named})
    model.zero_grad(set_to_none=True)
    assert float((naive - exact).norm() / exact.norm()) > 1e-2


#: Through the real loop: clipping (GSPO's default ε, 2 inner epochs), 2 mini-batches, micro-batches of
#: 3 (groups of 4 split), truncation at 4 tokens. Step 1 trains on a chosen batch (``--replay_dir``) with
#: unequal lengths and truncated rows in three of its four groups, whatever this machine's model samples;
#: step 2 samples at T = 1.5.
LOOP = dict(
    inner_epochs=2, num_minibatches=2, micro_batch_size=3, max_new_tokens=4, temperature=1.5, prompts_per_step=4,
    steps=2, truncation="mask", lr=2e-3,
)  # fmt: skip


#: The loop trains in float32: a group's net Σ_i c_i sums its G = 4 rows' T = 4 token coefficients, each
#: s̃_i·Â_i with Â from a mean over the G rows, so |net| / gross is 0 up to the rounding of G·T + G terms.
RESIDUAL_TOL = rounding_tolerance(1.0, 4 * LOOP["max_new_tokens"] + 4)


def _loop(tiny_model, root, **kw):
    cfg = make_cfg(tiny_model, root / "run", **{**LOOP, **kw})
    return tr.train(cfg, replay_dir=replay_dir(root / "replay", cfg, TRUNCATED_LENGTHS)).rows


@pytest.mark.parametrize("transform", list(TRANSFORMS))
def test_dfpo_sequence_net_residual_is_zero_in_the_loop(tiny_model, tmp_path, transform):
    rows = _loop(tiny_model, tmp_path, objective="dfpo", transform=transform)
    assert all(r["opt_steps"] == 4 for r in rows)
    # at GSPO's ε (3e-4 / 4e-4) the second inner epoch's sequence ratios are outside the band
    assert rows[0]["truncated_frac"] == 0.375 and rows[0]["clip/frac"] > 0
    for r in rows:
        assert r["sequence_net_residual"] <= RESIDUAL_TOL, (r["step"], r["sequence_net_residual"])


def test_sequence_net_residual_is_not_zero_without_the_paper_estimator(tiny_model, tmp_path):
    """Contrasts on the same chosen step: DFPO's ppo_clip variant silences clipped sequences; GRPO's
    token-mean weighs completions by their (unequal) lengths."""
    rows = _loop(tiny_model, tmp_path / "pc", objective="dfpo", estimator="ppo_clip")
    assert rows[0]["sequence_net_residual"] > 1e-2
    plain = {"inner_epochs": 1, "num_minibatches": 1, "micro_batch_size": 0, "truncation": "keep"}
    rows = _loop(tiny_model, tmp_path / "g", objective="grpo", aggregation="token-mean", **plain)
    assert rows[0]["sequence_net_residual"] > 1e-2


def test_lopti_stages_are_taken_together_by_all_processes():
    """A stage empty on this process but not on another is still taken (``any_process``), so the
    processes' optimiser steps stay in lockstep; without it the stage is skipped here."""
    from cancellation.update import Schedule, lopti_stage_advantages, minibatches

    old_logp = torch.log(torch.tensor([[0.9, 0.8], [0.7, 0.95]]))  # every π_old ≥ η = 0.5: no low stage
    mask, adv, group = torch.ones(2, 2), torch.tensor([1.0, -1.0]), torch.tensor([0, 0])
    assert len(lopti_stage_advantages(adv, old_logp, mask, 0.5)) == 1
    both = lopti_stage_advantages(adv, old_logp, mask, 0.5, any_process=lambda flag: True)
    assert len(both) == 2 and float(both[0].abs().sum()) == 0.0
    steps = minibatches(
        group, adv, Schedule(lopti_eta=0.5), old_logp=old_logp, mask=mask, any_process=lambda flag: True
    )
    assert [mb.stage for mb in steps] == [0, 1]


def _budgets(batch):
    """Token budgets that split the setup's groups of 4: one row per pass, and ~2 rows per pass."""
    from scaledrun.packing import RowLengths

    lengths = RowLengths.of(batch)
    widest = int(lengths.prompt.max() + lengths.completion.max())
    return lengths, [widest, int(2.5 * widest)]


@pytest.mark.exactness
@pytest.mark.parametrize(("objective", "params"), OBJECTIVES, ids=[_id(v) for v in OBJECTIVES])
def test_token_budget_micro_batches_give_the_one_pass_gradient(setup, objective, params):
    """Packed micro-batches (sorted, trimmed, groups larger than the budget split) = one pass (float64)."""
    from scaledrun.packing import pack_rows

    _cfg, _, _, batch = setup
    lengths, budgets = _budgets(batch)
    for budget in budgets:
        bins = pack_rows(lengths, batch.group, budget)
        # the property under test is certain for this input: some group is cut across passes
        assert any(len(set(batch.group[b].tolist())) == 1 and len(b) < 4 for b in bins), budget
    for aggregation in ("token-mean", "seq-mean-token-mean"):
        whole, g_whole = _update(setup, 0, objective, params, aggregation)
        for budget in budgets:
            res, g = _update(
                setup, 0, objective, {**params, "max_tokens_per_micro_batch": budget}, aggregation
            )
            _same_update(res, whole, g, g_whole, (aggregation, budget))
            # trimmed passes: fewer token slots than the mini-batch padded to its widest row
            assert res.slots < len(batch) * batch.input_ids.shape[1]
            assert res.tokens == float(batch.attention_mask.sum())


@pytest.mark.exactness
def test_on_policy_update_reuses_the_old_logprobs(tiny_model, tmp_path):
    """On-policy (old log-probs scored by the current weights), the first optimizer step takes its
    coefficients from them: the same gradient as scoring again (float64: ``tests/exactness.py``), fewer
    rows through the model."""
    from accelerate import Accelerator

    cfg = make_cfg(tiny_model, tmp_path, grad_clip=None, micro_batch_size=3, objective="grpo")
    model, tokenizer = load_model_and_tokenizer(cfg)
    model.double()
    batch, _ = _rollout(cfg, model, tokenizer)  # on-policy: old log-probs scored by these weights
    batch = as_float64(batch)
    model.train()
    batch.advantages = ADVANTAGES.clone()
    runs = {}
    for reuse in (False, True):
        recorder = _RecordingOptimizer(model)
        res = tr.update(
            cfg, Accelerator(cpu=True), model, recorder, batch, batch.advantages, torch.Generator(),
            on_policy=reuse, measure=False,
        )  # fmt: skip
        runs[reuse] = (res, _flat(recorder.steps[0]))
    (res0, g0), (res1, g1) = runs[False], runs[True]
    assert float(g0.abs().max()) > 0
    assert max_abs_err(g1, g0) <= FLOAT64_RTOL * float(g0.abs().max())
    # 8 rows: scored twice (no-grad coefficient pass, then the gradient pass) or once
    assert (res0.rows_scored, res1.rows_scored) == (16.0, 8.0)
    assert res1.metrics["ratio/min"] == res1.metrics["ratio/max"] == 1.0


def test_gradients_sync_once_per_mini_batch(setup):
    """DeepSpeed runs its optimizer step on every backward with ``sync_gradients`` on: the update turns it
    off for every micro-batch but a mini-batch's last (and DDP's ``no_sync`` with it)."""
    cfg, accelerator, model, batch = setup
    calls = []
    real = accelerator.backward

    def counting(loss, **kw):
        calls.append(accelerator.sync_gradients)
        return real(loss, **kw)

    accelerator.backward = counting
    try:
        _lengths, budgets = _budgets(batch)
        for fields in ({"micro_batch_size": 3}, {"max_tokens_per_micro_batch": budgets[1]}, {}):
            calls.clear()
            c = RunConfig(**{**cfg.__dict__, "num_minibatches": 2, "inner_epochs": 2, **fields})
            res = tr.update(c, accelerator, model, _RecordingOptimizer(model), batch, batch.advantages,
                            torch.Generator().manual_seed(0), measure=False)  # fmt: skip
            assert res.opt_steps == 4 and calls.count(True) == 4, (fields, calls)
            assert len(calls) > 4 or not fields, (fields, calls)  # several passes per mini-batch
            assert accelerator.sync_gradients  # restored
    finally:
        accelerator.backward = real
