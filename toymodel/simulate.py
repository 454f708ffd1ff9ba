"""Simulated group-relative RL training on a tabular scenario, with any ``cancellation`` objective.

One call of ``simulate`` is one training run. The update is the one the LM trainer runs
(``cancellation.update``, "one update, written once"); only the log-probs (a table lookup) and the
backward to the parameters (closed form) are the toy's own. Every step:

1. freeze θ_old (a copy of the current logits);
2. sample ``num_groups`` groups of ``group_size`` trajectories from π_old (each group gets its own
   prompt id; all groups answer the same prompt distribution, the scenario's single prompt), token by
   token: the step draws B × T float64 uniforms from the run's generator (``torch.rand(B, T)``, T the
   longest trajectory: one per sample row and token position) and row b takes at position t the
   token whose cumulative-probability interval under π_old(·|h_t) holds u[b, t]
   (``TabularPolicy.sample_from_uniforms``, exactly π_old's trajectory distribution). The uniforms
   depend on the seed only, never on the objective or the policy, so two arms with the same seed
   share them position by position (common random numbers: a change of the policy moves only the
   tokens whose own context's boundaries moved past their uniform);
3. rewards, then ``cancellation.group_advantages`` per group;
4. reward-balanced batching (optional, ``reward_balanced_rho``): the groups join a
   ``cancellation.update.RewardBalancedBuffer`` (a FIFO of whole groups, payload: the trajectory
   indices) and an update happens only when it returns ``num_groups`` groups whose positive and
   negative fractions are each ≥ ρ (those groups leave the buffer); the oldest groups beyond
   ``max_buffer_groups`` are dropped after every step;
5. old log-probs from θ_old; Advantage Reweighting (optional, ``ar_alpha``);
6. the optimiser steps of ``cancellation.update.minibatches``: ``inner_epochs`` passes over the
   mini-batches (``batching="query"`` or ``"random"``, ``num_minibatches``) against the frozen θ_old,
   so the ratios leave 1 after the first inner step and clipping and sequence coupling act; Lopti
   (optional, ``lopti_eta``) runs this twice (``lopti_stage_advantages``: first with the advantages
   zeroed outside the low-probability tokens, π_old < η, then outside the others, with the same old
   log-probs, so stage 2's ratios include stage 1's drift). Each optimiser step takes the
   coefficients c = ∂J/∂logp of its whole mini-batch (``cancellation.update.coefficients``, one
   ``compute_loss`` call), backpropagates −c to the logits and steps; a
   ``cancellation.update.CancellationMeter`` reads the same c beside the update;
7. one row of exact statistics at the parameters after the step's updates.

Rows (``ROW_KEYS``, the same keys in every row, floats):

- ``step``: 1-based, the row is taken after this step's updates;
- ``updated``: 1.0 if the step updated the parameters (0.0 when reward-balanced batching deferred);
- ``buffer_groups``: groups waiting in the reward-balanced buffer after the step (0 without it);
- ``sampled_reward``: mean reward of the groups sampled this step;
- ``expected_reward``, ``entropy`` (trajectory entropy, nats), ``equiv_entropy``, ``equiv_log_odds``:
  exact, by enumeration (``TabularPolicy``);
- ``template_kl``: exact Σ_h d_θ(h)·KL(π_θ(·|h) ‖ π_init(·|h)) over the scenario's template contexts
  (learning tax), 0.0 when the scenario has none;
- three residuals (``cancellation.update.RESIDUAL_KEYS``), each a ratio Σ|net| / Σ gross of the
  coefficients ∂J/∂logp that the step's optimiser steps applied (inner epochs × mini-batches × Lopti
  stages, each optimiser step counted on its own mini-batch; 0: everything cancels, 1: nothing does).
  An event or group that a mini-batch split separates counts in each mini-batch separately, which is
  the damage query-preserved batching avoids. NaN when the gross is 0 (no update, every advantage 0,
  or every coefficient 0):

  - ``shared_residual``: per event (group, context, action) occurring at least twice in the batch
    (DFPO eq. 2, 72). Forced steps (a context with a single action, whose score direction is the zero
    vector) are left out. Events shared by only part of a group keep Σ Â ≠ 0 under every objective,
    so this one is not 0 even for a perfect objective (that part is credit assignment);
  - ``group_shared_residual``: the same ratio restricted to the events that *every* completion of the
    group contains (DFPO Prop. 3.1's event E_t*). Here Σ_i Â_i = 0 makes GRPO inside its clip range
    cancel exactly (eq. 9) and DFPO's paper estimator cancel exactly with equal lengths (clipped
    sequences included), so what is left is what the objective or the batching broke: sequence
    coupling (eq. 13), clipping (App. F), length normalisation (eq. 72), a group split across
    mini-batches (cancellation-hypothesis paper Sec. 4);
  - ``sequence_net_residual``: per group, |Σ_i c_i| / Σ_i |c_i| with c_i = Σ_t c_{i,t} the total
    coefficient of completion i (the net push on every completion of the group at once). DFPO's
    paper estimator gives c_i = s̃_i·Â_i/B with Σ_i Â_i s̃_i = 0, so it is 0 for any lengths (with its
    defaults: the length-normalised ratio and ``seq-mean-token-mean``, and groups kept whole by the
    mini-batches; ``length_norm=False`` or ``token-mean`` weigh c_i by |y_i|); GRPO's token-mean with
    unequal lengths is not 0;

- ``pos_high_up`` (``DIAG_KEYS``; ``simulate`` only, NaN in ``simulate_seeds``): the Lopti paper's Fig. 3
  measure, the fraction of the batch's tokens at a real choice (more than one action), in completions
  with Â > 0 and with π_old ≥ ``HIGH_PROB``, whose probability went up over the step's updates
  (``cancellation.diagnostics.token_flip_stats`` with τ = 0 on those tokens); NaN when the batch has
  none. The paper reports that plain GRPO updates many of them downwards (low-probability tokens'
  larger gradients dominate the shared parameters; on the toy they share only their context's logits)
  and that Advantage Reweighting and Lopti raise the fraction;

- the objective's metrics (``cancellation.METRIC_KEYS``: ``asym``, ``clip/low_frac``, ``ratio/mean``,
  ...) from the last optimiser step, i.e. at the parameters just before it.

Without an update (reward-balanced batching still waiting) the residuals and the objective's metrics
are NaN: there is no update to measure.

Choices (each documented where it is made):

- the gradient: ``coefficients`` runs autograd through ``compute_loss`` from a leaf (B, T) ``logp``;
  the log_softmax and gather backward to the (C, K) logits is applied in closed form
  (``TabularPolicy.logits_grad``, tested equal to autograd), which halves the cost of the hot loop;
- the optimisers are ``torch.optim.SGD`` (no momentum) and ``torch.optim.Adam`` (its defaults);
- an exact shortcut: with plain SGD, no KL term and every advantage of the batch 0, every objective's
  gradient is exactly 0, so the backward passes are skipped (the mini-batch splits are still drawn
  and the last optimiser step's metrics still computed, so the rows are the same, tested; Adam is
  never skipped, its momentum moves the parameters on a zero gradient). Once the reward saturates
  most steps are like that, which is most of the speed of long runs;
- mini-batches are re-split at every inner epoch (as PPO implementations do); a buffered group's old
  log-probs are recomputed with the θ_old of the step that uses it (verl recomputes old log-probs
  with the actor before each update; the buffer's staleness is not corrected, as in the paper's
  description of an extra update condition on the rollout buffer).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from cancellation import METRIC_KEYS, OBJECTIVES, compute_loss, group_advantages, reweight_advantages
from cancellation.diagnostics import jitter2, steps_to_threshold, token_flip_stats
from cancellation.update import (
    RESIDUAL_KEYS,
    CancellationMeter,
    RewardBalancedBuffer,
    Schedule,
    coefficients,
    minibatches,
)

from .policy import TabularPolicy
from .scenarios import Scenario, get_scenario

#: The per-step keys of every row (the objective's metrics follow them in ``ROW_KEYS``).
STEP_KEYS: tuple[str, ...] = (
    "step",
    "updated",
    "buffer_groups",
    "sampled_reward",
    "expected_reward",
    "entropy",
    "equiv_entropy",
    "equiv_log_odds",
    "template_kl",
    *RESIDUAL_KEYS,  # shared_residual, group_shared_residual, sequence_net_residual
)
#: Per-step diagnostics of ``simulate`` that the batched toy does not compute (NaN there).
DIAG_KEYS: tuple[str, ...] = ("pos_high_up",)
#: The keys of every row ``simulate`` returns, in order.
ROW_KEYS: tuple[str, ...] = (
    *STEP_KEYS,
    *DIAG_KEYS,
    *METRIC_KEYS,
)
#: ``pos_high_up``'s high-probability tokens: π_old ≥ this (the Lopti paper's unified η).
HIGH_PROB = 0.5

OPTIMIZERS = ("sgd", "adam")

#: Default learning rate per optimiser, chosen by a sweep (SGD 0.5 and 2.0; 2.0 saturates within ~10
#: steps). With SGD at 0.5, G=8 and 4 inner epochs the expected reward reaches 0.9 after 4-136 steps
#: (3 seeds, every scenario and objective): fastest GRPO on equivalent_solutions, slowest GSPO on
#: shared_prefix, since with its default clip range it clips most sequences after the first inner step
#: and its clipped objective gives a clipped sequence no gradient (DFPO's paper estimator keeps it).
#: Adam normalises the step size per logit; at 0.05 it reaches 0.9 after 2-29 steps.
DEFAULT_LR = {"sgd": 0.5, "adam": 0.05}


def _make_optimizer(params: Tensor, kind: str, lr: float) -> torch.optim.Optimizer:
    """``torch.optim`` SGD (no momentum) or Adam (its defaults) on the (C, K) logits.

    Unused slots hold −inf and always get a zero gradient, so both leave them at −inf.
    """
    if kind == "sgd":
        return torch.optim.SGD([params], lr=lr)
    return torch.optim.Adam([params], lr=lr)


def _check_int(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"`{name}` must be an int, got {type(value).__name__}")
    if value < low:
        raise ValueError(f"`{name}` must be ≥ {low}, got {value}")
    return value


def _nan_metrics() -> dict[str, float]:
    return {k: math.nan for k in METRIC_KEYS}


def simulate(
    scenario: Scenario | str,
    objective: str,
    steps: int = 200,
    group_size: int = 8,
    lr: float | None = None,
    optimizer: str = "sgd",
    inner_epochs: int = 4,
    seed: int = 0,
    *,
    num_groups: int = 1,
    batching: str = "query",
    num_minibatches: int = 1,
    reward_balanced_rho: float | None = None,
    lopti_eta: float | None = None,
    ar_alpha: float | None = None,
    adv_scale: str = "group",
    aggregation: str | None = None,
    init_logits: Tensor | None = None,
    max_buffer_groups: int | None = None,
    callback: Callable[[int, Tensor], None] | None = None,
    _skip_zero_advantage: bool = True,
    **objective_params: Any,
) -> list[dict[str, float]]:
    """Train the scenario's tabular policy with ``objective``; one row per step (see the module docstring).

    Args:
        scenario: a ``Scenario`` or its name (``toymodel.SCENARIOS``).
        objective: a registered objective (``grpo``, ``grpo_symclip``, ``gspo``, ``dfpo``).
        steps: number of training steps (rows).
        group_size: G, completions per group.
        lr: learning rate; ``DEFAULT_LR[optimizer]`` when None.
        optimizer: ``"sgd"`` (default: the update direction is exactly the objective's gradient, the
            setting of the paper's first-order analysis, eq. 40) or ``"adam"``.
        inner_epochs: passes over the mini-batches per step against the same θ_old (PPO epochs).
        seed: seeds the one ``torch.Generator`` used for sampling and mini-batch splits; the same seed
            gives identical rows. Each step draws its B × T sampling uniforms first, then the splits'
            ``torch.randperm`` draws (none with one mini-batch).
        num_groups: groups per step (each its own prompt id).
        batching: ``"query"`` (query-preserved mini-batches) or ``"random"``.
        num_minibatches: optimiser steps per inner epoch.
        reward_balanced_rho: ρ of reward-balanced batching (None: off).
        lopti_eta: η of Lopti's two-stage update (None: off).
        ar_alpha: α of Advantage Reweighting (None: off).
        adv_scale: ``group_advantages``'s ``scale`` (``"group"``, ``"batch"``, ``"none"``).
        aggregation: the objective's aggregation (None: the objective's own default).
        init_logits: (C, K) starting logits (the scenario's initial policy when None); also the
            reference of ``template_kl``.
        max_buffer_groups: reward-balanced buffer capacity; the oldest groups are dropped beyond it
            (default 16·num_groups) so a run whose rewards saturate cannot grow it without bound.
        callback: called after every step as ``callback(step, logits)`` with a copy of the (C, K) logits
            (e.g. to animate the policy tables or to inspect the parameters in tests).
        **objective_params: passed to the objective (``epsilon_low``, ``transform``, ``length_norm``, ...).
    Returns:
        ``steps`` rows, dicts with exactly the keys ``ROW_KEYS``, all floats.
    """
    sc = get_scenario(scenario)
    policy: TabularPolicy = sc.policy()
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; valid: {', '.join(OBJECTIVES)}")
    if objective == "dfpo" and (ar_alpha is not None or lopti_eta is not None):
        raise ValueError(
            "dfpo needs one advantage per completion (its group transforms act on the group's advantage "
            "vector), but Advantage Reweighting (ar_alpha) and Lopti (lopti_eta) make them per token; "
            "use them with grpo, grpo_symclip or gspo, or drop them for dfpo"
        )
    steps = _check_int("steps", steps, 0)
    group_size = _check_int("group_size", group_size, 1)
    inner_epochs = _check_int("inner_epochs", inner_epochs, 1)
    num_groups = _check_int("num_groups", num_groups, 1)
    num_minibatches = _check_int("num_minibatches", num_minibatches, 1)
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}; valid: {', '.join(OPTIMIZERS)}")
    lr = DEFAULT_LR[optimizer] if lr is None else float(lr)
    if not (lr > 0.0 and math.isfinite(lr)):
        raise ValueError(f"`lr` must be a finite number > 0, got {lr}")
    schedule = Schedule(
        inner_epochs, num_minibatches, batching, None if lopti_eta is None else float(lopti_eta)
    )
    cap = (
        16 * num_groups
        if max_buffer_groups is None
        else _check_int("max_buffer_groups", max_buffer_groups, 1)
    )
    # reward-balanced batching: a FIFO of whole groups; the payload is the trajectory indices
    buffer: RewardBalancedBuffer[Tensor] | None = None
    if reward_balanced_rho is not None:
        if cap < num_groups:
            raise ValueError(f"`max_buffer_groups`={cap} must be ≥ num_groups={num_groups}")
        buffer = RewardBalancedBuffer(
            float(reward_balanced_rho), num_groups, cap, concat=torch.cat, select=lambda p, r: p[r]
        )
    loss_kwargs = dict(objective_params)
    no_kl = float(objective_params.get("beta", 0.0)) == 0.0
    if aggregation is not None:
        loss_kwargs["aggregation"] = aggregation

    init = sc.initial_logits() if init_logits is None else init_logits.detach().clone().to(policy.dtype)
    policy.check_logits(init)
    logits = init.clone()  # the parameters (a leaf); their .grad comes from ``policy.logits_grad``
    opt = _make_optimizer(logits, optimizer, lr)
    gen = torch.Generator().manual_seed(int(seed))
    template_ids = sc.template_context_ids()
    n_actions = policy.valid.sum(-1)
    free_steps = policy.valid_steps & (n_actions[policy.ctx] > 1)  # (N, T): steps with a real choice
    ck = policy.C * policy.K

    def event_keys(idx: Tensor, group: Tensor) -> Tensor:
        """(B, T) event ids (group, context, action) of trajectories ``idx``; −1 at forced steps."""
        ginv = torch.unique(group, return_inverse=True)[1]
        return torch.where(free_steps[idx], policy.event_keys[idx] + ginv[:, None] * ck, -1)

    batch = num_groups * group_size
    within = torch.arange(num_groups).repeat_interleave(group_size)

    rows: list[dict[str, float]] = []
    for step in range(1, steps + 1):
        # 1-3: freeze θ_old, sample the groups, rewards and advantages
        lsm_old = torch.log_softmax(logits, -1)  # θ_old: frozen for the whole step
        # one uniform per (row, token position), drawn before the step's mini-batch splits, then each
        # row sampled token by token from π_old (common random numbers across objectives)
        u = torch.rand(batch, policy.T, dtype=torch.float64, generator=gen)
        idx: Tensor | None = policy.sample_from_uniforms(lsm_old, u)
        group = within + (step - 1) * num_groups  # unique prompt ids across steps (the buffer mixes steps)
        rewards = policy.rewards[idx]
        adv = group_advantages(rewards, group, scale=adv_scale)
        sampled_reward = float(rewards.mean())

        # 4: reward-balanced batching picks the groups to update on (None: keep sampling)
        if buffer is not None:
            buffer.push(idx, adv, group)
            sel = buffer.selection()
            if sel is not None:
                group, adv = buffer.group[sel], buffer.advantages[sel]
            idx = buffer.pop(sel)

        metrics = _nan_metrics()
        residuals = dict.fromkeys(RESIDUAL_KEYS, math.nan)
        pos_high_up = math.nan
        if idx is not None:
            # 5: the batch's tokens and old log-probs; Advantage Reweighting from π_old, once per step
            ctx_b, act_b, mask_b = policy.ctx[idx], policy.act[idx], policy.mask[idx]
            old_logp = lsm_old[ctx_b, act_b] * mask_b
            token_adv = adv if ar_alpha is None else reweight_advantages(adv, old_logp, float(ar_alpha))
            # Exact shortcut: with every advantage 0 and no KL term, every objective's gradient is exactly
            # 0, so plain SGD would not move. Skip the backward passes (keeping the RNG draws of the
            # splits and the last optimiser step's metrics, so the rows are identical; tested). Adam is
            # not skipped: its momentum moves the parameters even on a zero gradient.
            skip = _skip_zero_advantage and optimizer == "sgd" and no_kl and not bool(adv.any())
            # the meter reads the coefficients per event (group, context, action) of the whole batch
            meter = None if skip else CancellationMeter(event_keys(idx, group), mask_b, group)

            # 6: Lopti stages × inner epochs × mini-batches, each one optimiser step against θ_old
            for mb in minibatches(group, token_adv, schedule, old_logp=old_logp, mask=mask_b, generator=gen):
                if skip and not mb.last:
                    continue  # the exact shortcut (this mini-batch's split is still drawn)
                r = mb.rows
                lsm = torch.log_softmax(logits, -1)
                args = (lsm[ctx_b[r], act_b[r]] * mask_b[r], old_logp[r], mb.advantages, mask_b[r], group[r])
                if skip:  # the exact shortcut's last step: its metrics, no gradient
                    with torch.no_grad():
                        metrics = compute_loss(objective, *args, **loss_kwargs)[1]
                    continue
                out = coefficients(objective, *args, with_metrics=mb.last, **loss_kwargs)
                # ∂loss/∂logp = −coef: the log_softmax/gather backward to the (C, K) logits in closed form
                logits.grad = policy.logits_grad(-out.coef, idx[r], lsm.exp())
                opt.step()
                meter.add(out.coef, r)  # measuring, beside the update
                if mb.last:
                    metrics = out.metrics
            if meter is not None:
                residuals = meter.totals.residuals()
            # the Lopti paper's Fig. 3, beside the update: high-probability tokens of Â > 0 completions
            high = free_steps[idx] & (old_logp >= math.log(HIGH_PROB)) & (adv[:, None] > 0)
            if bool(high.any()):
                new_logp = torch.log_softmax(logits.detach(), -1)[ctx_b, act_b] * mask_b
                flips = token_flip_stats(old_logp, new_logp, adv, high.to(mask_b.dtype), tau=0.0)
                pos_high_up = flips["flip/pos_boosted"]

        # 7: exact statistics at the parameters after the step's updates
        st = policy.stats(logits, init if template_ids.numel() else None, template_ids)
        row = {
            "step": float(step),
            "updated": 1.0 if idx is not None else 0.0,
            "buffer_groups": 0.0 if buffer is None else float(buffer.num_buffered),
            "sampled_reward": sampled_reward,
            "expected_reward": st["expected_reward"],
            "entropy": st["entropy"],
            "equiv_entropy": st["equiv_entropy"],
            "equiv_log_odds": st["equiv_log_odds"],
            "template_kl": st["kl"],
            **residuals,
            "pos_high_up": pos_high_up,
        }
        row.update({k: float(metrics[k]) for k in METRIC_KEYS})
        rows.append(row)
        if callback is not None:
            callback(step, logits.clone())
    return rows


def summarize(
    rows_by_seed: Sequence[Sequence[Mapping[str, float]]] | Mapping[Any, Sequence[Mapping[str, float]]],
    metric: str,
    threshold: float | None = None,
) -> dict[str, Any]:
    """Summarise one metric over several seeds' runs.

    Args:
        rows_by_seed: one list of rows per seed (or a dict seed → rows), as ``simulate`` returns.
        metric: a row key (``ROW_KEYS``).
        threshold: for ``steps_to_threshold`` (DFPO Table 2): the first ``step`` whose value is ≥ it.
    Returns:
        a dict: ``metric``, ``seeds``; ``final_mean``/``final_std`` of the last row's value (sample std,
        0 for one seed; NaN values are left out); ``jitter2_mean``/``jitter2_std`` of each seed's
        Jitter₂ (DFPO eq. 20, NaN steps dropped; NaN if fewer than 3 values remain); and with a
        threshold ``steps_to_threshold`` (per seed, None where never reached), ``reached_frac`` and
        ``steps_mean`` (mean over the seeds that reached it, NaN if none did).
    """
    runs = list(rows_by_seed.values()) if isinstance(rows_by_seed, Mapping) else list(rows_by_seed)
    if not runs or any(len(r) == 0 for r in runs):
        raise ValueError("`rows_by_seed` needs at least one non-empty run")
    if metric not in runs[0][0]:
        raise ValueError(f"unknown metric {metric!r}; valid: {', '.join(runs[0][0])}")

    def mean_std(xs: list[float]) -> tuple[float, float]:
        xs = [x for x in xs if not math.isnan(x)]
        if not xs:
            return math.nan, math.nan
        mu = sum(xs) / len(xs)
        sd = math.sqrt(sum((x - mu) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
        return mu, sd

    finals = [float(r[-1][metric]) for r in runs]
    jit = []
    for r in runs:
        vals = [float(row[metric]) for row in r if not math.isnan(float(row[metric]))]
        jit.append(jitter2(vals) if len(vals) >= 3 else math.nan)
    out: dict[str, Any] = {"metric": metric, "seeds": len(runs)}
    out["final_mean"], out["final_std"] = mean_std(finals)
    out["jitter2_mean"], out["jitter2_std"] = mean_std(jit)
    if threshold is not None:
        hits = [
            steps_to_threshold(
                [float(row[metric]) for row in r], threshold, [float(row["step"]) for row in r]
            )
            for r in runs
        ]
        out["threshold"] = float(threshold)
        out["steps_to_threshold"] = hits
        reached = [h for h in hits if h is not None]
        out["reached_frac"] = len(reached) / len(hits)
        out["steps_mean"] = sum(reached) / len(reached) if reached else math.nan
    return out


__all__ = ["DEFAULT_LR", "DIAG_KEYS", "HIGH_PROB", "OPTIMIZERS", "ROW_KEYS", "simulate", "summarize"]
