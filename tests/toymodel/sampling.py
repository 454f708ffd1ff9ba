"""The toy's sampling by a plain loop: the reference the simulators' per-position draws are tested against.

``sample_by_hand`` walks each row token by token in Python: the context of the prefix so far (the prefix,
or the position), the softmax of its actions as Python floats, and the first action whose running sum
divided by the total exceeds the row's uniform at that position. ``draw`` replays one step of
``simulate``'s stream: B × T float64 uniforms from the generator, then ``sample_by_hand``.
"""

from __future__ import annotations

import math

import torch

from toymodel.policy import TabularPolicy


def sample_by_hand(policy: TabularPolicy, logits: torch.Tensor, u: torch.Tensor) -> list[int]:
    """The trajectory index of each row of ``u`` (B, T): position t's token inverts π(·|h_t) at u[b, t]."""
    complete = {tau: i for i, tau in enumerate(policy.trajectories)}
    out = []
    for row in u.tolist():
        prefix: tuple[str, ...] = ()
        while prefix not in complete:
            t = len(prefix)
            c = policy.context_id(prefix if policy.context_mode == "prefix" else t)
            acts = policy.actions[c]
            zs = [float(logits[c, k]) for k in range(len(acts))]
            m = max(zs)
            ps = [math.exp(z - m) for z in zs]
            total = sum(ps)
            running, pick = 0.0, len(acts) - 1
            for k, p in enumerate(ps):
                running += p
                if row[t] < running / total:
                    pick = k
                    break
            prefix = (*prefix, acts[pick])
        out.append(complete[prefix])
    return out


def draw(policy: TabularPolicy, logits: torch.Tensor, n: int, generator: torch.Generator) -> torch.Tensor:
    """(n,) one step's samples as ``simulate`` draws them: ``torch.rand(n, T)`` uniforms, token by token."""
    u = torch.rand(n, policy.T, dtype=torch.float64, generator=generator)
    return torch.tensor(sample_by_hand(policy, logits, u), dtype=torch.long)
