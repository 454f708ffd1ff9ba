"""Many seeds of the tabular simulator as one batched computation.

``simulate_seeds`` runs S seeds of ``toymodel.simulate.simulate`` at once: every seed has its own (C, K)
logits (together a (S, C, K) tensor), its own samples and its own statistics, and one set of tensor ops
serves all seeds (no Python loop over seeds inside a step). Per seed it reproduces ``simulate`` to
rounding (tested to 1e-6 on ``template_task`` and ``equivalent_solutions``):

- the same random stream: seed s draws from ``torch.Generator().manual_seed(s)`` exactly what
  ``simulate`` draws: per step B × T float64 uniforms (``torch.rand(B, T)``, one per sample row and
  token position, T the longest trajectory), and each row is sampled token by token from π_old, the
  token at position t being the inverse CDF of π_old(·|h_t) at u[b, t]
  (``TabularPolicy.sample_from_uniforms``, batched over the seeds: (S, C, K) tables, (S, B, T)
  uniforms). With one mini-batch nothing else touches the generator, so each seed's uniforms for the
  whole run are drawn at once (S generator calls per run; consecutive ``torch.rand`` calls continue
  one stream, so this equals ``simulate``'s per-step draws); with ``num_minibatches`` > 1 the
  query-preserved split's ``torch.randperm`` draws interleave, and each seed's draws are then made per
  step in ``simulate``'s order (its B × T uniforms, then one randperm per inner epoch: a small loop
  over the seeds per step, correct but slower);
- common random numbers across arms: the uniforms depend on the seed only, never on the objective, so
  two arms with the same seed differ only through their policies, and they pair position by
  position: a policy change moves the token at position t only where π(·|h_t)'s boundaries move past
  u[b, t] (one uniform inverted over all N trajectories' CDF, the scheme before, moved every
  boundary with any change, and two arms' draws were barely paired);
- the objective: S seeds × ``num_groups`` groups are one flat batch for ``cancellation.update.coefficients``
  (the objectives already take a flat batch with group ids), with a unique group id per (seed, group)
  and seed-major rows. The aggregation's normaliser is made per seed: the ``seq-mean-*`` aggregations
  get ``seq_count`` = the rows of one seed's mini-batch (the same for every seed); ``token-mean`` gets
  ``token_count=1`` (a plain sum) and each seed's coefficients are then divided by that seed's own token
  count. The seeds share no parameters, so the gradient of Σ_seeds loss_seed with respect to one seed's
  logits is that seed's own gradient;
- the backward to the logits is ``TabularPolicy.logits_grad``'s closed form, batched over seeds;
- the optimiser, per seed with its own learning rate ``lr[s]``: plain SGD (``p ← p − lr[s]·g``,
  ``torch.optim.SGD``'s arithmetic) or Adam (``torch.optim.Adam``'s defaults and arithmetic, as
  ``simulate`` uses it: per-seed first and second moments, β = (0.9, 0.999), bias correction, ε = 1e-8;
  every seed takes every optimiser step, so one step count serves all seeds);
- per-seed hyper-parameters: ``lr`` and the clip range ``epsilon_low`` / ``epsilon_high`` may each be a
  number or one value per seed (a 1-D tensor or sequence of length S). A per-seed ε is expanded to one ε
  per row of the flat batch (rows are seed-major), which the objectives take elementwise; so one call
  can sweep a hyper-parameter (S = values × seeds) and each seed still equals ``simulate`` at its own
  values;
- exact statistics by enumeration as ``TabularPolicy.stats``, with the trajectory log-probabilities as
  one matrix product (S, C·K) @ (C·K, N) instead of a gather.

Exact shortcut (as ``simulate``'s): a seed whose advantages are all 0 this step has an exactly zero
gradient under plain SGD without a KL term, so only the seeds with a learning signal enter the flat
batch (its residuals are NaN, as in ``simulate``). Under Adam there is no shortcut (as in ``simulate``):
a zero gradient still moves the parameters through the moments, so every seed takes every step.

Shared code: the residuals come from ``cancellation.update.CancellationMeter``, one meter per RL step on
the step's flat batch with one segment per moving seed (``segments``: per-seed sums, scatter-added, no
sync per optimiser step), as ``simulate`` uses it. The query-preserved split is inline here, not
``cancellation.update.minibatches``: that splits one seed's batch at a time, ~1 ms per seed-step against
~30 µs for the seeds' own ``torch.randperm`` draws that the batched split is built from (tested equal to
``simulate``).

Returned keys (``BATCHED_KEYS``): ``step``, ``updated`` (always 1), ``buffer_groups`` (always 0),
``sampled_reward``, ``expected_reward``, ``entropy``, ``equiv_entropy``, ``equiv_log_odds``,
``template_kl``, the three residuals (``shared_residual``, ``group_shared_residual``,
``sequence_net_residual``; ``residuals=False`` skips them for speed, they are NaN then) and
``zero_adv_group_frac`` (of the last mini-batch). The objective's other metrics (``loss``, ``asym``,
``clip/*``, ``ratio/*``, ...) are not computed: ``seed_rows`` fills them with NaN; use ``simulate`` when
you need them.

Supported: the objectives ``grpo``, ``grpo_symclip``, ``gspo``, ``dfpo`` with their parameters, SGD and
Adam, per-seed ``lr`` / ``epsilon_low`` / ``epsilon_high``, ``num_groups``, query-preserved mini-batches
(``num_minibatches``), ``adv_scale``, ``aggregation``, ``init_logits``.

Not supported (each raises a ValueError that points to ``simulate``): random mini-batches,
reward-balanced batching, Lopti, Advantage Reweighting, a KL term (``beta``), the trainer's
``token_count``/``seq_count``, and per-seed values of any other parameter.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from cancellation import OBJECTIVES, group_advantages
from cancellation.update import CancellationMeter, coefficients

from .policy import TabularPolicy
from .scenarios import Scenario, get_scenario
from .simulate import DEFAULT_LR, OPTIMIZERS, ROW_KEYS, STEP_KEYS, _check_int

#: The keys ``simulate_seeds`` computes (each a (S, steps) float64 tensor in its result).
BATCHED_KEYS: tuple[str, ...] = (*STEP_KEYS, "zero_adv_group_frac")

#: The parameters that may be given per seed (a 1-D tensor or sequence of length S).
PER_SEED_PARAMS: tuple[str, ...] = ("lr", "epsilon_low", "epsilon_high")

# torch.optim.Adam's defaults (what ``simulate`` uses)
_ADAM_BETAS = (0.9, 0.999)
_ADAM_EPS = 1e-8


def _unsupported(name: str, why: str) -> ValueError:
    return ValueError(
        f"simulate_seeds does not support {name} ({why}); run those seeds with toymodel.simulate.simulate"
    )


def _per_seed(name: str, value: Any, n_seeds: int) -> Tensor | None:
    """``value`` as an (S,) float64 tensor if it holds one value per seed; None if it is a single number."""
    if isinstance(value, Tensor):
        t = value.detach().to("cpu", torch.float64)
    elif isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
        return None  # a number (or a non-numeric parameter such as ``transform``)
    else:
        t = torch.as_tensor(value, dtype=torch.float64)
    if t.dim() == 0:
        return None
    if t.dim() != 1 or t.shape[0] != n_seeds:
        raise ValueError(
            f"`{name}` has shape {tuple(t.shape)} but there are {n_seeds} seeds: give a single number or "
            f"one value per seed (a 1-D tensor or sequence of length {n_seeds})"
        )
    return t


def _default_aggregation(objective: str) -> str:
    return str(inspect.signature(OBJECTIVES[objective]).parameters["aggregation"].default)


class _Exact:
    """Exact enumeration statistics of S policies at once (``TabularPolicy.stats``, batched).

    Built once per run: the (N, C·K) count of every (context, action) in every trajectory and the
    (N, C) context-visit incidence, so trajectory log-probs and visit probabilities are matrix products.
    """

    def __init__(self, policy: TabularPolicy, ref_logits: Tensor, template_ids: Tensor) -> None:
        n, c, k = policy.N, policy.C, policy.K
        flat = policy.ctx * k + policy.act
        inc = torch.zeros((n, c * k), dtype=policy.dtype)
        rows = torch.arange(n)[:, None].expand_as(flat)
        inc.index_put_(
            (rows[policy.valid_steps], flat[policy.valid_steps]),
            policy.mask[policy.valid_steps],
            accumulate=True,
        )
        self.inc_t = inc.T.contiguous()  # (C·K, N)
        visit = torch.zeros((n, c), dtype=policy.dtype)
        visit[policy._flat_traj, policy._flat_ctx] = 1.0  # a trajectory visits a context at most once
        self.visit = visit
        self.valid = policy.valid
        self.rewards = policy.rewards
        self.equivalent = policy.equivalent
        self.template_ids = template_ids
        self.ref_lsm = torch.log_softmax(ref_logits, -1)

    def traj_logp(self, lsm: Tensor) -> Tensor:
        """(S, N) log π(τ) from (S, C, K) log-softmax tables (−inf slots read as 0: they are never used)."""
        z = torch.where(self.valid, lsm, torch.zeros_like(lsm)).flatten(1)
        return z @ self.inc_t

    def stats(self, lsm: Tensor, lp: Tensor, p: Tensor) -> dict[str, Tensor]:
        """(S,) ``expected_reward``, ``entropy``, ``equiv_entropy``, ``equiv_log_odds``, ``template_kl``.

        ``lsm`` (S, C, K) log-softmax tables, ``lp`` (S, N) their trajectory log-probs, ``p`` = exp(lp).
        """
        out = {"expected_reward": p @ self.rewards, "entropy": -torch.linalg.vecdot(p, lp)}
        s = lp.shape[0]
        if self.equivalent.numel() >= 2:
            le = lp[:, self.equivalent]
            lq = le - torch.logsumexp(le, -1, keepdim=True)
            out["equiv_entropy"] = -(lq.exp() * lq).sum(-1)
            out["equiv_log_odds"] = le[:, 0] - le[:, 1]
        else:
            out["equiv_entropy"] = out["equiv_log_odds"] = torch.full((s,), math.nan, dtype=lp.dtype)
        if self.template_ids.numel():
            ids = self.template_ids
            d = p @ self.visit[:, ids]  # (S, n_template) d_θ(h)
            l_t = lsm[:, ids]
            pt = l_t.exp()
            ckl = torch.where(self.valid[ids], pt * (l_t - self.ref_lsm[ids]), torch.zeros_like(pt)).sum(-1)
            out["template_kl"] = (d * ckl).sum(-1)
        else:
            out["template_kl"] = torch.zeros(s, dtype=lp.dtype)
        return out


def simulate_seeds(
    scenario: Scenario | str,
    objective: str,
    seeds: Sequence[int] | int,
    steps: int = 200,
    group_size: int = 8,
    lr: float | Sequence[float] | Tensor | None = None,
    inner_epochs: int = 4,
    *,
    num_groups: int = 1,
    num_minibatches: int = 1,
    batching: str = "query",
    adv_scale: str = "group",
    aggregation: str | None = None,
    init_logits: Tensor | None = None,
    optimizer: str = "sgd",
    reward_balanced_rho: float | None = None,
    lopti_eta: float | None = None,
    ar_alpha: float | None = None,
    residuals: bool = True,
    return_samples: bool = False,
    return_logits: bool = False,
    **objective_params: Any,
) -> dict[str, Tensor]:
    """Train one tabular policy per seed with ``objective``, all seeds as one batched computation.

    Per seed the rows equal ``simulate(scenario, objective, steps, group_size, lr[s], optimizer,
    inner_epochs, seed, num_groups=..., num_minibatches=..., ...)`` to rounding (see the module docstring).

    Args:
        scenario: a ``Scenario`` or its name.
        objective: ``grpo``, ``grpo_symclip``, ``gspo`` or ``dfpo`` (any registered objective).
        seeds: the seeds (ints), or a count S meaning ``range(S)``.
        steps, group_size, inner_epochs, num_groups, num_minibatches, adv_scale, aggregation,
            init_logits: as in ``simulate``.
        lr: a number, or one per seed (a 1-D tensor or sequence of length S, row s for ``seeds[s]``);
            ``DEFAULT_LR[optimizer]`` when None.
        batching: only ``"query"`` (query-preserved mini-batches).
        optimizer: ``"sgd"`` (no momentum) or ``"adam"`` (``torch.optim.Adam``'s defaults), as ``simulate``.
        reward_balanced_rho, lopti_eta, ar_alpha: must be None (not supported; use ``simulate``).
        residuals: compute the three residuals (the cancellation meter); False skips them (NaN).
        return_samples: also return ``"samples"``, the (S, steps, B) long trajectory indices drawn at every
            step (row-aligned with ``simulate``'s batch: group g holds columns g·G ... g·G + G − 1).
        return_logits: also return ``"logits"``, the (S, C, K) float64 parameters after the last step
            (what ``simulate``'s ``callback`` receives at its last step, per seed).
        **objective_params: passed to the objective (``transform``, ``estimator``, ``epsilon_low``, ...);
            ``epsilon_low`` / ``epsilon_high`` may be one value per seed, like ``lr``.
    Returns:
        a dict: ``"seed"`` → (S,) long tensor of the seeds, and each key of ``BATCHED_KEYS`` → a (S, steps)
        float64 tensor (row s is seed ``seeds[s]``), ``"samples"`` with ``return_samples`` and ``"logits"``
        with ``return_logits``.
        ``seed_rows`` turns one seed into ``simulate``'s rows.
    """
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}; valid: {', '.join(OPTIMIZERS)}")
    adam = optimizer == "adam"
    if batching != "query":
        raise _unsupported(f"batching={batching!r}", "only query-preserved mini-batches are batched")
    for name, value in (
        ("reward_balanced_rho", reward_balanced_rho),
        ("lopti_eta", lopti_eta),
        ("ar_alpha", ar_alpha),
    ):
        if value is not None:
            raise _unsupported(
                f"`{name}`", "reward-balanced batching, Lopti and Advantage Reweighting are not batched"
            )
    for name in ("token_count", "seq_count"):
        if name in objective_params:
            raise _unsupported(
                f"`{name}`", "the batched toy sets the aggregation's normaliser per seed itself"
            )
    if float(objective_params.get("beta", 0.0)) != 0.0 or "ref_logp" in objective_params:
        raise _unsupported("a KL term (`beta`, `ref_logp`)", "the batched toy has no reference log-probs")
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; valid: {', '.join(OBJECTIVES)}")
    if adv_scale not in ("group", "batch", "none"):
        raise ValueError(f"unknown adv_scale {adv_scale!r}; valid: group, batch, none")
    seed_list = (
        list(range(_check_int("seeds", seeds, 1))) if isinstance(seeds, int) else [int(s) for s in seeds]
    )
    if not seed_list:
        raise ValueError("`seeds` is empty: give at least one seed")
    steps = _check_int("steps", steps, 0)
    group_size = _check_int("group_size", group_size, 1)
    inner_epochs = _check_int("inner_epochs", inner_epochs, 1)
    num_groups = _check_int("num_groups", num_groups, 1)
    num_minibatches = _check_int("num_minibatches", num_minibatches, 1)
    if num_minibatches > num_groups:
        raise ValueError(
            f"`num_minibatches`={num_minibatches} is more than the {num_groups} groups of a step "
            f"(query-preserved mini-batches keep groups whole); use num_minibatches ≤ num_groups"
        )
    n_seeds = len(seed_list)
    lr = DEFAULT_LR[optimizer] if lr is None else lr
    lr_seed = _per_seed("lr", lr, n_seeds)  # (S,) the learning rate of each seed
    if lr_seed is None:
        lr_seed = torch.full((n_seeds,), float(lr), dtype=torch.float64)
    if not bool((torch.isfinite(lr_seed) & (lr_seed > 0.0)).all()):
        raise ValueError(f"`lr` must be finite and > 0 (for every seed), got {lr}")
    agg = aggregation if aggregation is not None else _default_aggregation(objective)
    loss_kwargs = dict(objective_params)
    eps_seed: dict[str, Tensor] = {}  # per-seed clip ranges, expanded to the rows of every mini-batch
    for name, value in objective_params.items():
        per = _per_seed(name, value, n_seeds) if not isinstance(value, str) else None
        if per is None:
            continue
        if name not in PER_SEED_PARAMS:
            raise _unsupported(
                f"a per-seed `{name}`", f"only {', '.join(PER_SEED_PARAMS)} may take one value per seed"
            )
        eps_seed[name] = per
        del loss_kwargs[name]
    loss_kwargs["aggregation"] = agg
    token_mean = agg == "token-mean"

    sc = get_scenario(scenario)
    policy: TabularPolicy = sc.policy()
    init = sc.initial_logits() if init_logits is None else init_logits.detach().clone().to(policy.dtype)
    policy.check_logits(init)
    c_n, k_n = policy.C, policy.K
    ck = c_n * k_n
    logits = init.expand(n_seeds, c_n, k_n).contiguous()  # (S, C, K) the parameters
    if adam:  # torch.optim.Adam's state, per seed; every seed steps together, so one step count
        exp_avg, exp_avg_sq, adam_steps = torch.zeros_like(logits), torch.zeros_like(logits), 0
        beta1, beta2 = _ADAM_BETAS
    exact = _Exact(policy, init, sc.template_context_ids())
    gens = [torch.Generator().manual_seed(s) for s in seed_list]
    batch = num_groups * group_size
    within = torch.arange(num_groups).repeat_interleave(group_size)  # (B,) group of each row of a seed
    n_actions = policy.valid.sum(-1)
    free_steps = policy.valid_steps & (n_actions[policy.ctx] > 1)  # (N, T)
    # mini-batch k holds the groups at positions k, k+M, ... of a seed's shuffled group order: with
    # equal-size groups, query_preserved_split's LPT rule deals the shuffled groups round robin
    bin_sizes = [len(range(k, num_groups, num_minibatches)) for k in range(num_minibatches)]

    t_n = policy.T  # uniforms per sample row: one per token position
    uniforms = None
    if num_minibatches == 1:  # nothing but the sampling uses the generators: draw the whole run at once
        uniforms = torch.stack(
            [torch.rand(steps * batch * t_n, dtype=torch.float64, generator=g) for g in gens]
        ).view(n_seeds, steps, batch, t_n)

    out = {k: torch.full((n_seeds, steps), math.nan, dtype=torch.float64) for k in BATCHED_KEYS}
    samples = torch.zeros((n_seeds, steps, batch), dtype=torch.long) if return_samples else None
    stat_keys = ("expected_reward", "entropy", "equiv_entropy", "equiv_log_odds", "template_kl")
    # per-seed state: log-softmax tables and the exact statistics. A seed that does not move this step
    # keeps them, so they are recomputed only for the seeds that move
    lsm = torch.log_softmax(logits, -1)
    lp = exact.traj_logp(lsm)
    prev = exact.stats(lsm, lp, lp.exp())
    gid = (torch.arange(n_seeds)[:, None] * num_groups + within).flatten()
    for step in range(1, steps + 1):
        col = step - 1
        # 1-3: samples (token by token, each position's inverse CDF under θ_old at the seed's own
        # uniform), rewards, advantages
        perms: list[list[Tensor]] = []
        if uniforms is not None:
            u = uniforms[:, col].contiguous()
        else:  # simulate's order per seed: B × T uniforms, then one randperm per inner epoch
            u_list = []
            for g in gens:
                u_list.append(torch.rand(batch, t_n, dtype=torch.float64, generator=g))
                perms.append([torch.randperm(num_groups, generator=g) for _ in range(inner_epochs)])
            u = torch.stack(u_list)
        idx = policy.sample_from_uniforms(lsm, u)  # (S, B)
        if samples is not None:
            samples[:, col] = idx
        rewards = policy.rewards[idx]
        if adv_scale == "batch":
            centred = group_advantages(rewards.flatten(), gid, scale="none").view(n_seeds, batch)
            std = rewards.std(-1, keepdim=True) if batch > 1 else torch.zeros_like(rewards[:, :1])
            adv = centred / (std + 1e-6)
        else:
            adv = group_advantages(rewards.flatten(), gid, scale=adv_scale).view(n_seeds, batch)
        out["sampled_reward"][:, col] = rewards.mean(-1)

        # zero_adv_group_frac of the last mini-batch (simulate computes it also when nothing moves)
        zero_group = ~(adv != 0).view(n_seeds, num_groups, group_size).any(-1)  # (S, ng)
        if num_minibatches == 1:
            out["zero_adv_group_frac"][:, col] = zero_group.to(torch.float64).mean(-1)
        else:
            last_perm = torch.stack([pp[-1] for pp in perms])  # (S, ng)
            pos = torch.empty_like(last_perm).scatter_(
                1, last_perm, torch.arange(num_groups).expand_as(last_perm)
            )
            in_last = pos % num_minibatches == num_minibatches - 1
            out["zero_adv_group_frac"][:, col] = (zero_group & in_last).sum(-1).to(torch.float64) / bin_sizes[
                -1
            ]

        # the exact shortcut: only the seeds with a non-zero advantage move (the others keep everything);
        # not under Adam, whose moments move a seed on a zero gradient too (as in simulate)
        active = torch.arange(n_seeds) if adam else torch.nonzero((adv != 0).any(-1)).flatten()
        n_act = int(active.numel())
        if n_act:
            la = logits[active]  # (A, C, K) the moving seeds' parameters (a copy, written back below)
            lr_a = lr_seed[active][:, None, None]
            eps_a = {name: t[active] for name, t in eps_seed.items()}
            if adam:
                m_a, v_a = exp_avg[active], exp_avg_sq[active]
            ia = idx[active]  # (A, B)
            adv_a = adv[active]
            ctx_b, act_b, mask_b = policy.ctx[ia], policy.act[ia], policy.mask[ia]  # (A, B, T)
            fi = (torch.arange(n_act) * ck)[:, None, None] + ctx_b * k_n + act_b  # flat index into (A·C·K)
            old_logp = lsm[active].flatten()[fi] * mask_b  # θ_old
            lgroup = torch.arange(n_act)[:, None] * num_groups + within  # (A, B) local group ids
            meter = None
            if residuals:  # one meter on the step's flat batch, one segment per moving seed
                # event ids (local group, context, action), as simulate's; −1 at forced steps
                keys = torch.where(free_steps[ia], lgroup[:, :, None] * ck + ctx_b * k_n + act_b, -1)
                meter = CancellationMeter(
                    keys.flatten(0, 1),
                    mask_b.flatten(0, 1),
                    lgroup.flatten(),
                    segments=torch.arange(n_act).repeat_interleave(batch),
                )
            if num_minibatches == 1:
                schedule = [[torch.arange(batch).expand(n_act, batch)] for _ in range(inner_epochs)]
            else:
                schedule = []
                for e in range(inner_epochs):
                    perm = torch.stack([perms[int(s)][e] for s in active])  # (A, ng) shuffled groups
                    pos = torch.empty_like(perm).scatter_(1, perm, torch.arange(num_groups).expand_as(perm))
                    key = (pos % num_minibatches) * num_groups + torch.arange(num_groups)  # bin, then group
                    order = torch.sort(key, -1).values % num_groups  # (A, ng): groups by bin, ascending
                    parts, start = [], 0
                    for size in bin_sizes:
                        grp = order[:, start : start + size]
                        start += size
                        parts.append((grp[:, :, None] * group_size + torch.arange(group_size)).flatten(1))
                    schedule.append(parts)
            # 6: inner epochs × mini-batches, each one SGD step of every moving seed against its θ_old
            for parts in schedule:
                for rows in parts:  # rows: (A, r) batch rows of each moving seed, ascending
                    r = rows.shape[1]
                    if num_minibatches == 1:  # the whole batch: no gather
                        fi_m, mask_m, old_m = fi.flatten(0, 1), mask_b.flatten(0, 1), old_logp.flatten(0, 1)
                        adv_m, grp_m = adv_a.flatten(), lgroup.flatten()
                    else:
                        fi_m = torch.take_along_dim(fi, rows[:, :, None], 1).flatten(0, 1)
                        mask_m = torch.take_along_dim(mask_b, rows[:, :, None], 1).flatten(0, 1)
                        old_m = torch.take_along_dim(old_logp, rows[:, :, None], 1).flatten(0, 1)
                        adv_m = torch.take_along_dim(adv_a, rows, 1).flatten()
                        grp_m = torch.take_along_dim(lgroup, rows, 1).flatten()
                    lsm_a = torch.log_softmax(la, -1)
                    logp = lsm_a.flatten()[fi_m] * mask_m
                    # per-seed normaliser: seq-mean divides by one seed's rows, token-mean by one seed's tokens
                    kw = (
                        {**loss_kwargs, "token_count": 1.0}
                        if token_mean
                        else {**loss_kwargs, "seq_count": float(r)}
                    )
                    for name, t in eps_a.items():  # one ε per row (seed-major rows, r per seed)
                        kw[name] = t.repeat_interleave(r)
                    coef = coefficients(
                        objective, logp, old_m, adv_m, mask_m, grp_m, with_metrics=False, **kw
                    ).coef
                    if token_mean:
                        n_tok = mask_m.view(n_act, r, -1).sum((1, 2))
                        coef = (coef.view(n_act, r, -1) / n_tok[:, None, None]).flatten(0, 1)
                    # TabularPolicy.logits_grad, batched: ∂L/∂logp = −coef, then the log_softmax backward
                    g = torch.zeros(n_act * ck, dtype=coef.dtype)
                    g.index_add_(0, fi_m.flatten(), (-coef * mask_m).flatten())
                    g = g.view(n_act, c_n, k_n)
                    g = g - lsm_a.exp() * g.sum(-1, keepdim=True)
                    if adam:  # torch.optim.Adam's single-tensor step, per seed
                        adam_steps += 1
                        m_a.lerp_(g, 1 - beta1)
                        v_a.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                        bias1 = 1 - beta1 ** float(adam_steps)
                        bias2_sqrt = (1 - beta2 ** float(adam_steps)) ** 0.5
                        denom = (v_a.sqrt() / bias2_sqrt).add_(_ADAM_EPS)
                        la.sub_((lr_a / bias1) * m_a / denom)
                    else:  # torch.optim.SGD, no momentum
                        la.sub_(lr_a * g)
                    if meter is not None:  # measuring, beside the update
                        flat_rows = None
                        if num_minibatches > 1:  # the mini-batch's rows of the flat batch
                            flat_rows = (torch.arange(n_act)[:, None] * batch + rows).flatten()
                        meter.add(coef, flat_rows)
            if meter is not None:
                for name, value in meter.segment_residuals().items():
                    out[name][active, col] = value
            # 7: exact statistics of the moving seeds at their parameters after the step's updates
            logits[active] = la
            if adam:
                exp_avg[active], exp_avg_sq[active] = m_a, v_a
            lsm_a = torch.log_softmax(la, -1)
            lp_a = exact.traj_logp(lsm_a)
            p_a = lp_a.exp()
            lsm[active] = lsm_a
            new = exact.stats(lsm_a, lp_a, p_a)
            for name in stat_keys:
                prev[name][active] = new[name]
        for name in stat_keys:
            out[name][:, col] = prev[name]
    out["step"][:] = torch.arange(1, steps + 1, dtype=torch.float64)
    out["updated"][:] = 1.0
    out["buffer_groups"][:] = 0.0
    result: dict[str, Tensor] = {"seed": torch.tensor(seed_list, dtype=torch.long)}
    result.update(out)
    if samples is not None:
        result["samples"] = samples
    if return_logits:
        result["logits"] = logits.detach().clone()
    return result


def seed_rows(result: Mapping[str, Tensor], index: int) -> list[dict[str, float]]:
    """One seed of ``simulate_seeds``'s result as ``simulate``'s rows (keys ``ROW_KEYS``, floats).

    Args:
        result: what ``simulate_seeds`` returned.
        index: the seed's position in ``result["seed"]`` (not the seed itself).
    Returns:
        one dict per step; the keys that ``simulate_seeds`` does not compute (the objective's metrics
        except ``zero_adv_group_frac``) are NaN.
    """
    n = int(result["step"].shape[1])
    cols = {k: result[k][index].tolist() for k in BATCHED_KEYS}
    return [{k: (cols[k][j] if k in cols else math.nan) for k in ROW_KEYS} for j in range(n)]


__all__ = ["BATCHED_KEYS", "PER_SEED_PARAMS", "seed_rows", "simulate_seeds"]
