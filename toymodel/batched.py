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
sync per optimiser step), as ``simulate`` uses it. The query-preserved split is ``_minibatch_schedule``
here, not ``cancellation.update.minibatches``: that splits one seed's batch at a time, ~1 ms per seed-step
against ~30 µs for the seeds' own ``torch.randperm`` draws that the batched split is built from (tested
equal to ``simulate``).

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
from dataclasses import dataclass
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

# the exact statistics of step 7 (``_Exact.stats``), kept per seed between the steps that move it
_STAT_KEYS = ("expected_reward", "entropy", "equiv_entropy", "equiv_log_odds", "template_kl")


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


@dataclass(frozen=True)
class _Run:
    """The validated arguments of one ``simulate_seeds`` call (what ``simulate`` checks before its loop)."""

    objective: str
    seeds: list[int]
    steps: int
    group_size: int
    inner_epochs: int
    num_groups: int
    num_minibatches: int
    adv_scale: str
    adam: bool
    residuals: bool
    lr: Tensor  # (S,) the learning rate of each seed
    eps: dict[str, Tensor]  # per-seed clip ranges, (S,) each; expanded to the rows of every mini-batch
    loss_kwargs: dict[str, Any]  # the objective's other parameters, ``aggregation`` included
    token_mean: bool  # the aggregation is token-mean (its normaliser is made per seed)

    @property
    def n_seeds(self) -> int:
        return len(self.seeds)

    @property
    def batch(self) -> int:
        """B: the rows of one seed's step."""
        return self.num_groups * self.group_size

    @property
    def bin_sizes(self) -> list[int]:
        """The groups in each query-preserved mini-batch (bin k holds shuffled positions k, k+M, ...)."""
        return [len(range(k, self.num_groups, self.num_minibatches)) for k in range(self.num_minibatches)]


def _check_arguments(
    *,
    objective: str,
    seeds: Sequence[int] | int,
    steps: int,
    group_size: int,
    lr: float | Sequence[float] | Tensor | None,
    inner_epochs: int,
    num_groups: int,
    num_minibatches: int,
    batching: str,
    adv_scale: str,
    aggregation: str | None,
    optimizer: str,
    reward_balanced_rho: float | None,
    lopti_eta: float | None,
    ar_alpha: float | None,
    residuals: bool,
    objective_params: dict[str, Any],
) -> _Run:
    """Step 0 of ``simulate`` (its checks before the loop), plus the refusals of what is not batched and the
    per-seed parameters (``lr``, ``epsilon_low``, ``epsilon_high``) as (S,) tensors."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}; valid: {', '.join(OPTIMIZERS)}")
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
    eps_seed: dict[str, Tensor] = {}
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
    return _Run(
        objective=objective,
        seeds=seed_list,
        steps=steps,
        group_size=group_size,
        inner_epochs=inner_epochs,
        num_groups=num_groups,
        num_minibatches=num_minibatches,
        adv_scale=adv_scale,
        adam=optimizer == "adam",
        residuals=residuals,
        lr=lr_seed,
        eps=eps_seed,
        loss_kwargs=loss_kwargs,
        token_mean=agg == "token-mean",
    )


class _RandomStream:
    """The seeds' random draws in ``simulate``'s order (step 1's uniforms, step 6's mini-batch splits).

    Seed s draws from ``torch.Generator().manual_seed(s)``. With one mini-batch nothing but the sampling
    uses a generator, so each seed's uniforms for the whole run are drawn at once (consecutive
    ``torch.rand`` calls continue one stream); otherwise each step draws, per seed, its B × T uniforms and
    then one ``torch.randperm`` of the groups per inner epoch, as ``simulate`` does.
    """

    def __init__(self, run: _Run, t_n: int) -> None:
        self.run, self.t_n = run, t_n
        self.gens = [torch.Generator().manual_seed(s) for s in run.seeds]
        self.uniforms: Tensor | None = None
        if run.num_minibatches == 1:  # nothing but the sampling uses the generators: draw the run at once
            self.uniforms = torch.stack(
                [torch.rand(run.steps * run.batch * t_n, dtype=torch.float64, generator=g) for g in self.gens]
            ).view(run.n_seeds, run.steps, run.batch, t_n)

    def draw(self, col: int) -> tuple[Tensor, list[list[Tensor]]]:
        """Step 1 of ``simulate`` (its ``torch.rand(B, T)``) at RL step ``col + 1``: the (S, B, T) uniforms and,
        with mini-batches, each seed's ``inner_epochs`` group permutations for step 6's splits
        (``perms[s][e]``; empty with one mini-batch)."""
        run = self.run
        perms: list[list[Tensor]] = []
        if self.uniforms is not None:
            return self.uniforms[:, col].contiguous(), perms
        u_list = []  # simulate's order per seed: B × T uniforms, then one randperm per inner epoch
        for g in self.gens:
            u_list.append(torch.rand(run.batch, self.t_n, dtype=torch.float64, generator=g))
            perms.append([torch.randperm(run.num_groups, generator=g) for _ in range(run.inner_epochs)])
        return torch.stack(u_list), perms


def _advantages(run: _Run, rewards: Tensor, gid: Tensor) -> Tensor:
    """Step 3 of ``simulate``: the (S, B) group-relative advantages of every seed's (S, B) rewards.

    ``gid`` is the flat batch's group id (unique per seed and group); ``adv_scale="batch"`` divides by
    each seed's own batch standard deviation.
    """
    if run.adv_scale == "batch":
        centred = group_advantages(rewards.flatten(), gid, scale="none").view(run.n_seeds, run.batch)
        std = rewards.std(-1, keepdim=True) if run.batch > 1 else torch.zeros_like(rewards[:, :1])
        return centred / (std + 1e-6)
    return group_advantages(rewards.flatten(), gid, scale=run.adv_scale).view(run.n_seeds, run.batch)


def _zero_adv_group_frac(run: _Run, adv: Tensor, perms: list[list[Tensor]]) -> Tensor:
    """(S,) ``zero_adv_group_frac``: the share of the last mini-batch's groups whose advantages are all 0
    (the objective's metric in ``simulate``'s step 6; it is computed also when nothing moves)."""
    zero_group = ~(adv != 0).view(run.n_seeds, run.num_groups, run.group_size).any(-1)  # (S, ng)
    if run.num_minibatches == 1:
        return zero_group.to(torch.float64).mean(-1)
    last_perm = torch.stack([pp[-1] for pp in perms])  # (S, ng)
    pos = torch.empty_like(last_perm).scatter_(
        1, last_perm, torch.arange(run.num_groups).expand_as(last_perm)
    )
    in_last = pos % run.num_minibatches == run.num_minibatches - 1
    return (zero_group & in_last).sum(-1).to(torch.float64) / run.bin_sizes[-1]


def _minibatch_schedule(run: _Run, perms: list[list[Tensor]], active: Tensor) -> list[list[Tensor]]:
    """Step 6's split of ``simulate`` (``cancellation.update.minibatches``, query-preserved), batched.

    One list per inner epoch, of one (A, r) tensor per mini-batch: the batch rows of each moving seed,
    ascending. Mini-batch k holds the groups at positions k, k+M, ... of a seed's shuffled group order:
    with equal-size groups, ``query_preserved_split``'s LPT rule deals the shuffled groups round robin.
    """
    n_act, batch, num_groups = int(active.numel()), run.batch, run.num_groups
    if run.num_minibatches == 1:
        return [[torch.arange(batch).expand(n_act, batch)] for _ in range(run.inner_epochs)]
    schedule = []
    for e in range(run.inner_epochs):
        perm = torch.stack([perms[int(s)][e] for s in active])  # (A, ng) shuffled groups
        pos = torch.empty_like(perm).scatter_(1, perm, torch.arange(num_groups).expand_as(perm))
        key = (pos % run.num_minibatches) * num_groups + torch.arange(num_groups)  # bin, then group
        order = torch.sort(key, -1).values % num_groups  # (A, ng): groups by bin, ascending
        parts, start = [], 0
        for size in run.bin_sizes:
            grp = order[:, start : start + size]
            start += size
            parts.append((grp[:, :, None] * run.group_size + torch.arange(run.group_size)).flatten(1))
        schedule.append(parts)
    return schedule


class _SeedOptimizer:
    """Step 6's optimiser step of ``simulate``, per seed with its own learning rate.

    Plain SGD (``torch.optim.SGD``'s arithmetic, no momentum) or Adam (``torch.optim.Adam``'s defaults and
    single-tensor arithmetic, per-seed moments; every seed takes every step, so one step count serves all).
    ``select`` gathers the moving seeds' state before a step's updates, ``store`` writes it back after.
    """

    def __init__(self, run: _Run, logits: Tensor) -> None:
        self.adam, self.lr = run.adam, run.lr
        if self.adam:
            self.exp_avg, self.exp_avg_sq, self.steps = torch.zeros_like(logits), torch.zeros_like(logits), 0

    def select(self, active: Tensor) -> None:
        self.lr_a = self.lr[active][:, None, None]
        if self.adam:
            self.m_a, self.v_a = self.exp_avg[active], self.exp_avg_sq[active]

    def step(self, params: Tensor, grad: Tensor) -> None:
        """One step of the selected seeds' (A, C, K) ``params`` (in place) on their gradient ``grad``."""
        if self.adam:  # torch.optim.Adam's single-tensor step, per seed
            beta1, beta2 = _ADAM_BETAS
            self.steps += 1
            self.m_a.lerp_(grad, 1 - beta1)
            self.v_a.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            bias1 = 1 - beta1 ** float(self.steps)
            bias2_sqrt = (1 - beta2 ** float(self.steps)) ** 0.5
            denom = (self.v_a.sqrt() / bias2_sqrt).add_(_ADAM_EPS)
            params.sub_((self.lr_a / bias1) * self.m_a / denom)
        else:  # torch.optim.SGD, no momentum
            params.sub_(self.lr_a * grad)

    def store(self, active: Tensor) -> None:
        if self.adam:
            self.exp_avg[active], self.exp_avg_sq[active] = self.m_a, self.v_a


class _Seeds:
    """The batched state of all seeds: the (S, C, K) parameters, their log-softmax tables, the optimiser
    and the exact statistics at the current parameters (step 7's, kept for the seeds that do not move)."""

    def __init__(self, run: _Run, policy: TabularPolicy, init: Tensor, exact: _Exact) -> None:
        self.logits = init.expand(run.n_seeds, policy.C, policy.K).contiguous()  # (S, C, K) the parameters
        self.opt = _SeedOptimizer(run, self.logits)
        self.exact = exact
        self.lsm = torch.log_softmax(self.logits, -1)
        lp = exact.traj_logp(self.lsm)
        self.stats = exact.stats(self.lsm, lp, lp.exp())

    def set_moved(self, active: Tensor, la: Tensor) -> None:
        """Step 7 of ``simulate``: store the moving seeds' parameters ``la`` after the step's updates and
        their exact statistics."""
        self.logits[active] = la
        self.opt.store(active)
        lsm_a = torch.log_softmax(la, -1)
        lp_a = self.exact.traj_logp(lsm_a)
        p_a = lp_a.exp()
        self.lsm[active] = lsm_a
        new = self.exact.stats(lsm_a, lp_a, p_a)
        for name in _STAT_KEYS:
            self.stats[name][active] = new[name]


class _MovingBatch:
    """Step 5 of ``simulate``: the moving seeds' batch as one flat batch of A·B rows (seed-major).

    ``fi`` (A, B, T) is each token's flat index into the moving seeds' (A·C·K) parameters, ``mask``
    (A, B, T) the token mask, ``old_logp`` (A, B, T) the log-probs under θ_old, ``adv`` (A, B) the
    advantages and ``group`` (A, B) local group ids (unique per moving seed and group).
    """

    def __init__(
        self, run: _Run, policy: TabularPolicy, lsm: Tensor, idx: Tensor, adv: Tensor, within: Tensor
    ):
        self.n_act = int(idx.shape[0])
        ck = policy.C * policy.K
        self.ctx, self.act, self.mask = policy.ctx[idx], policy.act[idx], policy.mask[idx]  # (A, B, T)
        self.fi = (torch.arange(self.n_act) * ck)[:, None, None] + self.ctx * policy.K + self.act
        self.old_logp = lsm.flatten()[self.fi] * self.mask  # θ_old
        self.adv = adv
        self.group = torch.arange(self.n_act)[:, None] * run.num_groups + within  # (A, B) local group ids

    def meter(self, policy: TabularPolicy, free_steps: Tensor, idx: Tensor, batch: int) -> CancellationMeter:
        """One cancellation meter on the flat batch, one segment per moving seed; the event ids (local
        group, context, action) are ``simulate``'s, −1 at forced steps."""
        ck = policy.C * policy.K
        keys = torch.where(free_steps[idx], self.group[:, :, None] * ck + self.ctx * policy.K + self.act, -1)
        return CancellationMeter(
            keys.flatten(0, 1),
            self.mask.flatten(0, 1),
            self.group.flatten(),
            segments=torch.arange(self.n_act).repeat_interleave(batch),
        )

    def rows(self, rows: Tensor | None) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """The flat (fi, mask, old_logp, adv, group) of the mini-batch ``rows`` ((A, r); None: all)."""
        if rows is None:  # the whole batch: no gather
            return (
                self.fi.flatten(0, 1),
                self.mask.flatten(0, 1),
                self.old_logp.flatten(0, 1),
                self.adv.flatten(),
                self.group.flatten(),
            )
        return (
            torch.take_along_dim(self.fi, rows[:, :, None], 1).flatten(0, 1),
            torch.take_along_dim(self.mask, rows[:, :, None], 1).flatten(0, 1),
            torch.take_along_dim(self.old_logp, rows[:, :, None], 1).flatten(0, 1),
            torch.take_along_dim(self.adv, rows, 1).flatten(),
            torch.take_along_dim(self.group, rows, 1).flatten(),
        )


def _minibatch_gradient(
    run: _Run,
    eps_a: dict[str, Tensor],
    lsm_a: Tensor,
    mb: tuple[Tensor, Tensor, Tensor, Tensor, Tensor],
    r: int,
) -> tuple[Tensor, Tensor]:
    """Step 6's loss and backward of ``simulate`` for one mini-batch of every moving seed.

    The coefficients of ``cancellation.update.coefficients`` on the flat mini-batch (r rows per seed) with
    the aggregation's normaliser made per seed, and ``TabularPolicy.logits_grad``'s closed form batched over
    the seeds. Returns (coef, the (A, C, K) gradient).
    """
    fi_m, mask_m, old_m, adv_m, grp_m = mb
    n_act, c_n, k_n = lsm_a.shape
    logp = lsm_a.flatten()[fi_m] * mask_m
    # per-seed normaliser: seq-mean divides by one seed's rows, token-mean by one seed's tokens
    kw = (
        {**run.loss_kwargs, "token_count": 1.0}
        if run.token_mean
        else {**run.loss_kwargs, "seq_count": float(r)}
    )
    for name, t in eps_a.items():  # one ε per row (seed-major rows, r per seed)
        kw[name] = t.repeat_interleave(r)
    coef = coefficients(run.objective, logp, old_m, adv_m, mask_m, grp_m, with_metrics=False, **kw).coef
    if run.token_mean:
        n_tok = mask_m.view(n_act, r, -1).sum((1, 2))
        coef = (coef.view(n_act, r, -1) / n_tok[:, None, None]).flatten(0, 1)
    # TabularPolicy.logits_grad, batched: ∂L/∂logp = −coef, then the log_softmax backward
    g = torch.zeros(n_act * c_n * k_n, dtype=coef.dtype)
    g.index_add_(0, fi_m.flatten(), (-coef * mask_m).flatten())
    g = g.view(n_act, c_n, k_n)
    return coef, g - lsm_a.exp() * g.sum(-1, keepdim=True)


def _update_moving_seeds(
    run: _Run,
    policy: TabularPolicy,
    seeds: _Seeds,
    active: Tensor,
    idx: Tensor,
    adv: Tensor,
    perms: list[list[Tensor]],
    within: Tensor,
    free_steps: Tensor,
) -> tuple[Tensor, dict[str, Tensor] | None]:
    """Steps 5-6 of ``simulate`` for the seeds ``active``: inner epochs × mini-batches, each one optimiser
    step of every moving seed against its θ_old, with the cancellation meter beside the update.

    Returns the moving seeds' (A, C, K) parameters after the step and their residuals (None without
    ``residuals``).
    """
    n_act = int(active.numel())
    la = seeds.logits[active]  # (A, C, K) the moving seeds' parameters (a copy, written back in step 7)
    seeds.opt.select(active)
    eps_a = {name: t[active] for name, t in run.eps.items()}
    ia = idx[active]  # (A, B)
    mbatch = _MovingBatch(run, policy, seeds.lsm[active], ia, adv[active], within)
    meter = mbatch.meter(policy, free_steps, ia, run.batch) if run.residuals else None
    for parts in _minibatch_schedule(run, perms, active):
        for rows in parts:  # rows: (A, r) batch rows of each moving seed, ascending
            whole = run.num_minibatches == 1
            coef, g = _minibatch_gradient(
                run, eps_a, torch.log_softmax(la, -1), mbatch.rows(None if whole else rows), rows.shape[1]
            )
            seeds.opt.step(la, g)
            if meter is not None:  # measuring, beside the update
                # the mini-batch's rows of the flat batch
                flat_rows = None if whole else (torch.arange(n_act)[:, None] * run.batch + rows).flatten()
                meter.add(coef, flat_rows)
    return la, None if meter is None else meter.segment_residuals()


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

    The loop is ``simulate``'s numbered steps, batched over the seeds: 0 ``_check_arguments``; 1-3
    ``_RandomStream.draw``, ``TabularPolicy.sample_from_uniforms``, ``_advantages`` (and
    ``_zero_adv_group_frac``); 5-6 ``_update_moving_seeds`` (``_MovingBatch``, ``_minibatch_schedule``,
    ``_minibatch_gradient``, ``_SeedOptimizer``); 7 ``_Seeds.set_moved`` (``_Exact.stats``).
    """
    run = _check_arguments(
        objective=objective,
        seeds=seeds,
        steps=steps,
        group_size=group_size,
        lr=lr,
        inner_epochs=inner_epochs,
        num_groups=num_groups,
        num_minibatches=num_minibatches,
        batching=batching,
        adv_scale=adv_scale,
        aggregation=aggregation,
        optimizer=optimizer,
        reward_balanced_rho=reward_balanced_rho,
        lopti_eta=lopti_eta,
        ar_alpha=ar_alpha,
        residuals=residuals,
        objective_params=objective_params,
    )
    n_seeds, steps = run.n_seeds, run.steps
    sc = get_scenario(scenario)
    policy: TabularPolicy = sc.policy()
    init = sc.initial_logits() if init_logits is None else init_logits.detach().clone().to(policy.dtype)
    policy.check_logits(init)
    seeds_state = _Seeds(run, policy, init, _Exact(policy, init, sc.template_context_ids()))
    stream = _RandomStream(run, policy.T)
    # (B,) the group of each row of a seed; (S·B,) group ids of the flat batch, unique per (seed, group)
    within = torch.arange(run.num_groups).repeat_interleave(run.group_size)
    gid = (torch.arange(n_seeds)[:, None] * run.num_groups + within).flatten()
    n_actions = policy.valid.sum(-1)
    free_steps = policy.valid_steps & (n_actions[policy.ctx] > 1)  # (N, T)

    out = {k: torch.full((n_seeds, steps), math.nan, dtype=torch.float64) for k in BATCHED_KEYS}
    samples = torch.zeros((n_seeds, steps, run.batch), dtype=torch.long) if return_samples else None
    for step in range(1, steps + 1):
        col = step - 1
        # 1-3: samples (token by token, each position's inverse CDF under θ_old at the seed's own
        # uniform), rewards, advantages
        u, perms = stream.draw(col)
        idx = policy.sample_from_uniforms(seeds_state.lsm, u)  # (S, B)
        if samples is not None:
            samples[:, col] = idx
        rewards = policy.rewards[idx]
        adv = _advantages(run, rewards, gid)
        out["sampled_reward"][:, col] = rewards.mean(-1)
        out["zero_adv_group_frac"][:, col] = _zero_adv_group_frac(run, adv, perms)

        # the exact shortcut: only the seeds with a non-zero advantage move (the others keep everything);
        # not under Adam, whose moments move a seed on a zero gradient too (as in simulate)
        active = torch.arange(n_seeds) if run.adam else torch.nonzero((adv != 0).any(-1)).flatten()
        if active.numel():
            # (4: reward-balanced batching is not batched.) 5-6: the moving seeds' batch, inner epochs ×
            # mini-batches of optimiser steps, the cancellation meter beside them
            la, res = _update_moving_seeds(
                run, policy, seeds_state, active, idx, adv, perms, within, free_steps
            )
            if res is not None:
                for name, value in res.items():
                    out[name][active, col] = value
            # 7: exact statistics of the moving seeds at their parameters after the step's updates
            seeds_state.set_moved(active, la)
        for name in _STAT_KEYS:
            out[name][:, col] = seeds_state.stats[name]
    out["step"][:] = torch.arange(1, steps + 1, dtype=torch.float64)
    out["updated"][:] = 1.0
    out["buffer_groups"][:] = 0.0
    result: dict[str, Tensor] = {"seed": torch.tensor(run.seeds, dtype=torch.long)}
    result.update(out)
    if samples is not None:
        result["samples"] = samples
    if return_logits:
        result["logits"] = seeds_state.logits.detach().clone()
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
