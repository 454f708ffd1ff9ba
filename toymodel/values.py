"""The counterfactual token value of the cancellation-hypothesis paper, exact, by enumeration of the support.

The paper: "The Cancellation Hypothesis in Critic-Free RL: From Outcome Rewards to Token Credits"
(arXiv 2605.08666). App. E.2 asks, at a state s (the token history before a token) and the token a taken
there, how much better taking a is than sampling an alternative from the policy:

    value(s, a) = Q(s, a) − E[R | s, not a] = (Q(s, a) − V(s)) / (1 − π(a|s))        (App. E.2, eq. 20)

with Q(s, a) = E[R | s, a] and V(s) = E[R | s] = π(a|s)·Q(s, a) + (1 − π(a|s))·E[R | s, not a]. The paper
estimates Q and V by Monte Carlo continuations (eq. 20's R̄(s, a), R̄(s)) and uses the value to compare
the tokens an update boosts with those it suppresses (Sec. 3, Fig. 5, 6, 11). On a toy scenario the
support is enumerated, so the expectations are exact:

    M(p) = Σ_{τ ⊒ p} π(τ),   W(p) = Σ_{τ ⊒ p} π(τ)·R(τ),   E[R | p] = W(p) / M(p)

over the trajectories τ of the support that extend the token prefix p. For step t of trajectory τ:
Q = E[R | τ[:t+1]], V = E[R | τ[:t]], π(a_t|s_t) = M(τ[:t+1]) / M(τ[:t]).

A state is the *token prefix*, not the policy's context: with ``context="position"`` two different
prefixes share one softmax, yet their continuations (and so their values) are conditioned on different
histories. Everything here therefore works on the prefix tree of the support's trajectories, whatever
the policy's context mode. A step whose prefix has a single continuation in the support (a forced token,
e.g. an end token) gets π = 1 exactly and Q = V, hence value NaN (``counterfactual_value``'s guard: no
alternative is ever sampled).

Shapes: N trajectories in the support, B selected trajectories (``idx``), T the longest trajectory.
"""

from __future__ import annotations

import math
import weakref
from typing import NamedTuple

import torch
from torch import Tensor

from cancellation.coupling import counterfactual_value

from .neural import NeuralPolicy
from .policy import TabularPolicy


class TokenValues(NamedTuple):
    """``exact_token_values``'s result, each (B, T) float64, NaN on padding.

    Attributes:
        value: the counterfactual token value (Q − V)/(1 − π) of App. E.2 eq. (20); NaN where π(a|s) is 1
            (or within ``min_alt_prob`` of it) and where the prefix has probability 0.
        q: Q(s_t, a_t) = E[R | τ[:t+1]].
        v: V(s_t) = E[R | τ[:t]].
        pi: π(a_t | s_t) = M(τ[:t+1]) / M(τ[:t]) (exactly 1 for a forced token).
    """

    value: Tensor
    q: Tensor
    v: Tensor
    pi: Tensor


class _PrefixTree(NamedTuple):
    """The prefix tree of a support: node ids of every prefix τ_i[:t], t = 0 .. T.

    Attributes:
        node: (N, T + 1) long, the id of τ_i[:t] (0 is the empty prefix, the root); −1 past the length.
        forced: (N, T) bool, step t of τ_i is the only continuation of its prefix in the support.
        n_nodes: the number of distinct prefixes (root and leaves included).
    """

    node: Tensor
    forced: Tensor
    n_nodes: int


_TREES: weakref.WeakKeyDictionary[TabularPolicy, _PrefixTree] = weakref.WeakKeyDictionary()


def _prefix_tree(structure: TabularPolicy) -> _PrefixTree:
    """The prefix tree of ``structure.trajectories`` (built once per structure, then cached)."""
    tree = _TREES.get(structure)
    if tree is not None:
        return tree
    t_max = structure.T
    ids: dict[tuple[str, ...], int] = {(): 0}
    children: dict[int, set[str]] = {}
    rows = []
    for tau in structure.trajectories:
        row = [0] + [-1] * t_max
        for t in range(1, len(tau) + 1):
            row[t] = ids.setdefault(tau[:t], len(ids))
            children.setdefault(row[t - 1], set()).add(tau[t - 1])
        rows.append(row)
    node = torch.tensor(rows, dtype=torch.long)
    n_children = torch.zeros(len(ids), dtype=torch.long)
    for parent, kids in children.items():
        n_children[parent] = len(kids)
    forced = (n_children[node[:, :t_max].clamp_min(0)] == 1) & structure.valid_steps
    tree = _PrefixTree(node=node, forced=forced, n_nodes=len(ids))
    _TREES[structure] = tree
    return tree


def _structure_of(policy: TabularPolicy | NeuralPolicy) -> TabularPolicy:
    if isinstance(policy, NeuralPolicy):
        return policy.structure
    if isinstance(policy, TabularPolicy):
        return policy
    raise ValueError(
        f"`policy` must be a toymodel TabularPolicy or NeuralPolicy, got {type(policy).__name__}"
    )


def _check_traj_probs(traj_probs: object, n: int) -> Tensor:
    if not isinstance(traj_probs, Tensor):
        raise ValueError(
            f"`traj_probs` must be a torch.Tensor of shape (N,), got {type(traj_probs).__name__}"
        )
    if traj_probs.dim() != 1 or traj_probs.shape[0] != n:
        raise ValueError(
            f"`traj_probs` must have shape (N,) = ({n},) (one probability per trajectory of the support), "
            f"got {tuple(traj_probs.shape)}"
        )
    if not traj_probs.is_floating_point():
        raise ValueError(f"`traj_probs` must be a floating-point tensor, got dtype {traj_probs.dtype}")
    p = traj_probs.detach().to(torch.float64)
    if not bool(torch.isfinite(p).all()):
        raise ValueError("`traj_probs` contains NaN/inf")
    if bool((p < 0).any()):
        raise ValueError("`traj_probs` holds a negative entry: pass probabilities (e.g. `policy.probs(...)`)")
    total = float(p.sum())
    if abs(total - 1.0) > 1e-6:
        raise ValueError(
            f"`traj_probs` must sum to 1 over the support (the trajectory distribution), got {total:.6g}"
        )
    return p


def _check_idx(idx: object, n: int) -> Tensor:
    if (
        not isinstance(idx, Tensor)
        or idx.dim() != 1
        or idx.is_floating_point()
        or idx.is_complex()
        or idx.dtype == torch.bool
    ):
        shown = tuple(idx.shape) if isinstance(idx, Tensor) else type(idx).__name__
        raise ValueError(f"`idx` must be a (B,) integer tensor of trajectory indices, got {shown}")
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= n):
        raise ValueError(f"`idx` holds trajectory indices outside [0, N) with N={n}")
    return idx.long()


def exact_token_values(
    policy: TabularPolicy | NeuralPolicy,
    traj_probs: Tensor,
    idx: Tensor,
    *,
    min_alt_prob: float = 1e-9,
) -> TokenValues:
    """App. E.2 eq. (20)'s counterfactual value of every token of trajectories ``idx``, exact by enumeration.

    For step t of trajectory τ = idx[b]: Q = E[R | τ[:t+1]], V = E[R | τ[:t]] and π(a_t|s_t) =
    M(τ[:t+1]) / M(τ[:t]), the expectations over the support weighted by ``traj_probs`` (module docstring),
    then value = ``counterfactual_value(Q, V, π)`` = (Q − V)/(1 − π) = Q − E[R | s_t, not a_t]. States are
    the token prefixes of the support, not the policy's contexts (they differ in ``context="position"``).

    Args:
        policy: a ``TabularPolicy`` or a ``NeuralPolicy`` (its ``structure`` gives the support, rewards and
            step mask).
        traj_probs: (N,) π(τ) of every trajectory of the support under the current policy, summing to 1
            (``TabularPolicy.probs(logits)``, ``NeuralPolicy.probs(params)``); detached, used in float64.
        idx: (B,) integer indices of the trajectories whose tokens are valued.
        min_alt_prob: ``counterfactual_value``'s guard: NaN where 1 − π ≤ it. Default 1e-9: in float64 the
            value's rounding error is about 1e-16/(1 − π), so closer to 1 it is noise; 0.0 gives NaN only
            at π = 1 exactly (forced tokens get π = 1 exactly either way).
    Returns:
        ``TokenValues(value, q, v, pi)``, each (B, T) float64, NaN on padding.
    """
    structure = _structure_of(policy)
    p = _check_traj_probs(traj_probs, structure.N)
    i = _check_idx(idx, structure.N)
    if isinstance(min_alt_prob, bool) or not isinstance(min_alt_prob, (int, float)):
        raise ValueError(f"`min_alt_prob` must be a number in [0, 1), got {min_alt_prob!r}")
    tree = _prefix_tree(structure)
    t_max = structure.T
    r = structure.rewards.to(torch.float64)
    # M(p), W(p): the probability and reward mass of the trajectories through every prefix node p
    on = tree.node >= 0
    rows = torch.arange(structure.N)[:, None].expand_as(tree.node)[on]
    nodes = tree.node[on]
    mass = torch.zeros(tree.n_nodes, dtype=torch.float64).index_add_(0, nodes, p[rows])
    reward_mass = torch.zeros(tree.n_nodes, dtype=torch.float64).index_add_(0, nodes, (p * r)[rows])
    node = tree.node[i]  # (B, T + 1)
    valid = structure.valid_steps[i]  # (B, T)
    parent, child = node[:, :t_max].clamp_min(0), node[:, 1:].clamp_min(0)
    m_parent, m_child = mass[parent], mass[child]
    nan = torch.full_like(m_parent, math.nan)
    reached = valid & (m_parent > 0)
    # E[R | prefix] = W / M on reached prefixes (a child of a reached prefix may itself have mass 0)
    v = torch.where(reached, reward_mass[parent] / torch.where(reached, m_parent, 1.0), nan)
    took = reached & (m_child > 0)
    q = torch.where(took, reward_mass[child] / torch.where(took, m_child, 1.0), nan)
    pi = torch.where(reached, (m_child / torch.where(reached, m_parent, 1.0)).clamp(0.0, 1.0), nan)
    forced = tree.forced[i] & reached
    # a forced token's prefix and child carry the same trajectories: π = 1 and Q = V exactly
    pi = torch.where(forced, torch.ones_like(pi), pi)
    q = torch.where(forced, v, q)
    # App. E.2 eq. (20): (Q − V)/(1 − π); an unreached step, a zero-mass token or padding stays NaN
    finite = took | forced
    value = counterfactual_value(
        torch.where(finite, q, 0.0), torch.where(finite, v, 0.0), torch.where(finite, pi, 0.0),
        min_alt_prob=float(min_alt_prob),
    )  # fmt: skip
    value = torch.where(finite, value, nan)
    return TokenValues(value=value, q=q, v=v, pi=pi)


__all__ = ["TokenValues", "exact_token_values"]
