"""scaledrun.verl_plugin: DFPO and the eq. (86) control through verl's own policy-loss registry.

Needs verl 0.9.1, which the project's ``dev`` extra does not install (it pins transformers < 5.11 and
imports Ray to load its loss module; docs/plugins.md, section verl): without it this file is skipped with
that reason, so ``make test`` does not run it. Run it in the verl venv of docs/plugins.md.

On a hand-made float64 batch (two groups of three completions of different lengths, some sequences
clipped), each registered loss, called as verl calls it (``get_policy_loss_fn(name)(old_log_prob,
log_prob, advantages, response_mask, loss_agg_mode, config)``), gives the value and the gradient that
(a) ``cancellation.compute_loss`` gives on the same rows and (b) a plain loop over the paper's formulas
gives: every token of completion i gets ∂J/∂logp = w_i·Â_i / |y_i| / B (seq-mean-token-mean), w_i the
transformed weight (Min-Replace: the group's smallest s̄; Orth-Proj: s̄ minus its projection on Â; the
eq. 86 control: s̄ itself). Then verl's ``ppo_loss``, fed verl's own micro-batches of a ``DataProto``
carrying ``uid``, adds up to the whole batch's loss when micro-batches hold whole groups, and refuses a
micro-batch size that splits them.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

pytest.importorskip(
    "verl",
    reason="verl 0.9.1 is not installed: the `verl` extra, in a venv of its own (docs/plugins.md, section verl)",
)

from verl import DataProto
from verl.trainer.ppo.core_algos import get_policy_loss_fn
from verl.utils import tensordict_utils as tu
from verl.workers.config import ActorConfig, PolicyLossConfig
from verl.workers.engine.utils import prepare_micro_batches
from verl.workers.utils.padding import left_right_2_no_padding

import cancellation
from scaledrun import verl_plugin

EPS_LOW, EPS_HIGH = 3e-4, 4e-4
N = 3  # rollout.n
LENGTHS = [4, 2, 3, 4, 1, 3]  # response lengths of the six completions (T = 4)
UID = ["p0", "p0", "p0", "p1", "p1", "p1"]
REWARDS = [1.0, 0.0, 0.0, 1.0, 1.0, 0.0]
# per-token log-ratio logp - old_logp: rows 0, 3 leave the band upwards, rows 1, 5 downwards
DELTA = [
    [1e-3, 2e-3, 0.0, 1e-3],
    [-2e-3, -1e-3, 0.0, 0.0],
    [1e-4, -1e-4, 2e-4, 0.0],
    [2e-3, 1e-3, 1e-3, 0.0],
    [1e-4, 0.0, 0.0, 0.0],
    [-1e-3, -2e-3, -3e-3, 0.0],
]

CASES = {
    "dfpo_min_replace": ("dfpo", {"transform": "min_replace"}),
    "dfpo_orth_proj": ("dfpo", {"transform": "orth_proj"}),
    "gspo_paper": ("gspo", {"estimator": "paper"}),
}


def _batch() -> dict[str, torch.Tensor]:
    b, t = len(LENGTHS), max(LENGTHS)
    mask = torch.tensor([[1.0 if j < n else 0.0 for j in range(t)] for n in LENGTHS], dtype=torch.float64)
    old = -torch.linspace(0.5, 2.5, b * t, dtype=torch.float64).reshape(b, t)
    logp = old + torch.tensor(DELTA, dtype=torch.float64) * mask
    # GRPO's advantage by hand: (r - mean) / std (population std) within each group
    adv = []
    for g in range(len(UID) // N):
        r = REWARDS[g * N : (g + 1) * N]
        mean = sum(r) / N
        std = math.sqrt(sum((x - mean) ** 2 for x in r) / N)
        adv += [(x - mean) / std for x in r]
    adv_seq = torch.tensor(adv, dtype=torch.float64)
    return {"logp": logp, "old": old, "mask": mask, "adv_seq": adv_seq, "adv_tok": adv_seq[:, None] * mask}


def _config(**kw) -> ActorConfig:
    return ActorConfig(
        strategy="fsdp", rollout_n=N, ppo_micro_batch_size_per_gpu=N, clip_ratio_low=EPS_LOW, clip_ratio_high=EPS_HIGH,
        **kw,
    )  # fmt: skip


def _loop_coefficients(name: str, batch: dict[str, torch.Tensor]) -> list[float]:
    """w_i·Â_i per completion, from the paper's formulas in plain Python (eq. 44, 47, 50, 18)."""
    adv = batch["adv_seq"].tolist()
    s_bar = []
    for i, n in enumerate(LENGTHS):
        s = math.exp(sum(DELTA[i][:n]) / n)  # DFPO eq. (44)
        c = min(max(s, 1 - EPS_LOW), 1 + EPS_HIGH)
        s_bar.append(min(s, c) if adv[i] >= 0 else max(s, c))  # DFPO eq. (47)
    w = list(s_bar)
    for g in range(len(UID) // N):
        rows = range(g * N, (g + 1) * N)
        if name == "dfpo_min_replace":
            low = min(s_bar[i] for i in rows)  # DFPO eq. (50)
            for i in rows:
                w[i] = low
        elif name == "dfpo_orth_proj":
            proj = sum(adv[i] * s_bar[i] for i in rows) / sum(adv[i] ** 2 for i in rows)  # DFPO eq. (18)
            for i in rows:
                w[i] = s_bar[i] - proj * adv[i]
    return [w[i] * adv[i] for i in range(len(LENGTHS))]


def _verl_loss(name: str, batch, agg: str = "seq-mean-token-mean"):
    logp = batch["logp"].clone().requires_grad_(True)
    with verl_plugin.groups(UID):
        loss, metrics = get_policy_loss_fn(name)(
            old_log_prob=batch["old"], log_prob=logp, advantages=batch["adv_tok"], response_mask=batch["mask"].bool(),
            loss_agg_mode=agg, config=_config(),
        )  # fmt: skip
    (grad,) = torch.autograd.grad(loss, logp)
    return loss, grad, metrics


@pytest.mark.exactness
@pytest.mark.parametrize("name", list(CASES))
def test_registered_loss_equals_the_papers_formulas_and_cancellation(name):
    batch = _batch()
    loss, grad, metrics = _verl_loss(name, batch)
    coef = _loop_coefficients(name, batch)
    b = len(LENGTHS)
    # value of the score-function term: Â_i·w_i; seq-mean-token-mean: −(1/B) Σ_i Â_i·w_i
    assert abs(loss.item() + sum(coef) / b) < 1e-12
    for i, n in enumerate(LENGTHS):
        for t in range(max(LENGTHS)):
            want = -coef[i] / n / b if t < n else 0.0
            assert abs(grad[i, t].item() - want) < 1e-12, (i, t)
    # cancellation's own result on the same rows (integer group ids)
    objective, params = CASES[name]
    logp = batch["logp"].clone().requires_grad_(True)
    ref, ref_metrics = cancellation.compute_loss(
        objective, logp, batch["old"], batch["adv_seq"], batch["mask"], torch.tensor([0, 0, 0, 1, 1, 1]),
        aggregation="seq-mean-token-mean", epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH, **params,
    )  # fmt: skip
    (ref_grad,) = torch.autograd.grad(ref, logp)
    assert abs(loss.item() - ref.item()) < 1e-9
    assert torch.allclose(grad, ref_grad, rtol=0, atol=1e-9)
    assert metrics["actor/pg_clipfrac"] == ref_metrics["clip/frac"]
    assert metrics["actor/cancellation/asym"] == ref_metrics["asym"]
    # rows 0, 1, 3, 5 are outside the band (clip/frac counts their tokens): 4 + 2 + 4 + 3 of 17 tokens
    assert abs(metrics["actor/pg_clipfrac"] - 13 / 17) < 1e-12


@pytest.mark.exactness
def test_dfpo_groups_cancel_and_the_control_does_not():
    """Σ_i w_i·Â_i = 0 in every group under DFPO (eq. 18 / Min-Replace with Σ Â = 0), not under eq. 86."""
    batch = _batch()
    for name in CASES:
        coef = _loop_coefficients(name, batch)
        _, grad, _ = _verl_loss(name, batch)
        # the applied coefficients, read back from the gradient: −B·|y_i|·∂L/∂logp_{i,0} = w_i·Â_i
        applied = [-grad[i, 0].item() * LENGTHS[i] * len(LENGTHS) for i in range(len(LENGTHS))]
        for g in range(2):
            net = sum(applied[g * N : (g + 1) * N])
            assert abs(net - sum(coef[g * N : (g + 1) * N])) < 1e-12
            if name.startswith("dfpo"):
                assert abs(net) < 1e-12
            else:
                assert abs(net) > 1e-5  # clipped weights differ within the group: the control does not cancel


@pytest.mark.exactness
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
def test_other_aggregations_follow_verls_counts(agg):
    batch = _batch()
    loss, _, _ = _verl_loss("dfpo_min_replace", batch, agg)
    coef = _loop_coefficients("dfpo_min_replace", batch)
    # every token of row i holds −Â_i·w_i; token sums are −|y_i|·Â_i·w_i
    token_sum = -sum(c * n for c, n in zip(coef, LENGTHS, strict=True))
    want = {
        "token-mean": token_sum / sum(LENGTHS),
        "seq-mean-token-sum": token_sum / len(LENGTHS),
        "seq-mean-token-sum-norm": token_sum / len(LENGTHS) / max(LENGTHS),  # verl's default C: T
    }[agg]
    assert abs(loss.item() - want) < 1e-12


def _micro_batches(micro: int, batch):
    """verl's own path: DataProto (with uid) -> TensorDict -> no padding -> micro-batches of ``micro`` rows."""
    b, t, p = len(LENGTHS), max(LENGTHS), 2
    attn = torch.cat([torch.ones(b, p, dtype=torch.long), batch["mask"].long()], dim=1)
    data = DataProto.from_dict(
        tensors={
            "input_ids": torch.arange(b * (p + t)).reshape(b, p + t) % 50, "attention_mask": attn,
            "position_ids": torch.arange(p + t).expand(b, -1).clone(),
            "prompts": torch.zeros(b, p, dtype=torch.long), "responses": torch.ones(b, t, dtype=torch.long),
            "response_mask": batch["mask"].long(), "old_log_probs": batch["old"], "advantages": batch["adv_tok"],
        },
        non_tensors={"uid": np.array(UID, dtype=object)},
    )  # fmt: skip
    td = left_right_2_no_padding(data.to_tensordict())
    tu.assign_non_tensor(
        td, use_dynamic_bsz=False, micro_batch_size_per_gpu=micro, dp_size=1, batch_num_tokens=sum(LENGTHS),
        global_batch_size=b,
    )  # fmt: skip
    micro_batches, _ = prepare_micro_batches(td)
    return micro_batches


def _model_output(logp: torch.Tensor, rows: list[int]):
    """The engine's no-padding log-probs: row i's response log-probs sit at positions p-1 .. p-2+|y_i|."""
    seqs = []
    for i in rows:
        n = LENGTHS[i]
        seqs.append(torch.cat([logp.new_zeros(1), logp[i, :n], logp.new_zeros(1)]))  # prompt of 2 tokens
    return {"log_probs": torch.nested.as_nested_tensor(seqs, layout=torch.jagged)}


@pytest.mark.exactness
@pytest.mark.parametrize("name", list(CASES))
def test_verls_ppo_loss_over_whole_group_micro_batches_sums_to_the_batch_loss(name):
    import verl.workers.utils.losses as losses

    assert getattr(losses.ppo_loss, "__cancellation_groups__", False)  # install() wrapped it on import
    batch = _batch()
    logp = batch["logp"].clone().requires_grad_(True)
    cfg = _config(loss_agg_mode="seq-mean-token-mean", policy_loss=PolicyLossConfig(loss_mode=name))
    total = 0.0
    mbs = _micro_batches(N, batch)
    assert len(mbs) == 2
    for k, mb in enumerate(mbs):
        assert list(mb["uid"]) == UID[k * N : (k + 1) * N]
        loss, _ = losses.ppo_loss(
            config=cfg, model_output=_model_output(logp, list(range(k * N, (k + 1) * N))), data=mb
        )
        total = total + loss
    (grad,) = torch.autograd.grad(total, logp)
    coef = _loop_coefficients(name, batch)
    b = len(LENGTHS)
    assert abs(total.item() + sum(coef) / b) < 1e-12
    for i, n in enumerate(LENGTHS):
        assert torch.allclose(
            grad[i, :n], torch.full((n,), -coef[i] / n / b, dtype=torch.float64), rtol=0, atol=1e-12
        )


def test_micro_batches_that_split_groups_are_refused():
    import verl.workers.utils.losses as losses

    batch = _batch()
    cfg = _config(
        loss_agg_mode="seq-mean-token-mean", policy_loss=PolicyLossConfig(loss_mode="dfpo_min_replace")
    )
    mb = _micro_batches(2, batch)[0]  # rows 0, 1 of group p0 (rollout.n = 3)
    with pytest.raises(ValueError, match="ppo_micro_batch_size_per_gpu"):
        losses.ppo_loss(config=cfg, model_output=_model_output(batch["logp"], [0, 1]), data=mb)


def test_bad_inputs_are_refused_with_what_to_fix():
    batch = _batch()
    fn = get_policy_loss_fn("dfpo_orth_proj")
    args = dict(old_log_prob=batch["old"], log_prob=batch["logp"], advantages=batch["adv_tok"],
                response_mask=batch["mask"].bool(), loss_agg_mode="seq-mean-token-mean", config=_config())  # fmt: skip
    with pytest.raises(ValueError, match="uid"):
        fn(**args)  # no group ids set
    with verl_plugin.groups(UID):
        per_token = batch["adv_tok"].clone()
        per_token[0, 1] += 0.5
        with pytest.raises(ValueError, match="one advantage per completion"):
            fn(**{**args, "advantages": per_token})
        with pytest.raises(ValueError, match="token-sum"):
            fn(**{**args, "loss_agg_mode": "token-sum"})
        with pytest.raises(ValueError, match="rollout_correction"):
            fn(**args, rollout_is_weights=torch.ones_like(batch["old"]))
