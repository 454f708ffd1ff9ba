"""A tabular softmax policy over an explicit, finite set of complete trajectories.

A toy scenario lists its *support*: every complete trajectory, a tuple of token strings. Each step of a
trajectory has a *context* h (what the policy conditions on) and an *action* a (the token emitted):

- ``context="prefix"`` (the default): h is the exact prefix before the step, i.e. a node of the prefix
  tree of the support. This is an autoregressive policy with a separate softmax at every node.
- ``context="position"``: h is the time step alone (a lattice), as if the hidden state ignored which
  synonym came earlier. Every completion that reaches step t shares the same softmax, the way an LM's
  template tokens share weights. The support must then be the full Cartesian product of the tokens seen
  at each position (checked), so that sampling step by step can only produce listed trajectories.

The actions of a context are the tokens that follow it in the support, in first-appearance order. The
parameters are one logit vector per context, a (C, K) tensor (K = the largest number of actions) with
−inf in unused slots; the gradient of ``log_softmax`` in a −inf slot is exactly 0, so SGD and Adam
leave those slots at −inf.

Everything is exact (enumeration over the support) and vectorised: index tensors are built once in the
constructor; no method loops over trajectories or tokens in Python.

Shapes: N trajectories, T the longest trajectory, C contexts, K action slots.

- ``ctx`` (N, T) long: context id of each step (0 on padding);
- ``act`` (N, T) long: action slot of each step (0 on padding);
- ``mask`` (N, T) float64: 1 on real steps, 0 on padding;
- ``rewards`` (N,) float64;
- ``event_keys`` (N, T) long: ctx·K + act, −1 on padding. Two steps with the same key have the same
  context and action, hence the same score direction ∇θ log π(a|h): DFPO's shared context-token event
  (eq. 71). In ``position`` mode that is literally true of the shared weights.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

import torch
from torch import Tensor

CONTEXT_MODES = ("prefix", "position")


class TabularPolicy:
    """The structure of a tabular softmax policy; the parameters (logits) are passed to every method.

    Args:
        support: the complete trajectories, each a non-empty sequence of token strings. None may be a
            proper prefix of another and none may repeat (so each is a leaf of the prefix tree and the
            trajectory probabilities sum to 1).
        rewards: one reward per trajectory.
        context: ``"prefix"`` or ``"position"`` (see the module docstring).
        equivalent: indices of the trajectories forming the "equivalent correct" set of the scenario
            (same reward, different surface form); ``equiv_entropy`` and ``equiv_log_odds`` use it.
        dtype: float dtype of every tensor (float64 by default: the tests compare to 1e-12).
    """

    def __init__(
        self,
        support: Sequence[Sequence[str]],
        rewards: Sequence[float],
        context: str = "prefix",
        equivalent: Sequence[int] = (),
        dtype: torch.dtype = torch.float64,
    ) -> None:
        if context not in CONTEXT_MODES:
            raise ValueError(f"unknown context mode {context!r}; valid: {', '.join(CONTEXT_MODES)}")
        trajs = [tuple(str(tok) for tok in tau) for tau in support]
        if not trajs:
            raise ValueError("`support` is empty: list at least one complete trajectory")
        if len(rewards) != len(trajs):
            raise ValueError(
                f"`rewards` has {len(rewards)} entries but `support` has {len(trajs)} trajectories"
            )
        if any(len(tau) == 0 for tau in trajs):
            raise ValueError("`support` holds an empty trajectory; every trajectory needs at least one token")
        if len(set(trajs)) != len(trajs):
            raise ValueError("`support` lists a trajectory twice; each trajectory must appear once")
        as_set = set(trajs)
        for tau in trajs:
            for t in range(1, len(tau)):
                if tau[:t] in as_set:
                    raise ValueError(
                        f"trajectory {tau[:t]} is a proper prefix of {tau}: end every trajectory with an end "
                        "token so that none is a prefix of another"
                    )
        self.context_mode = context
        self.trajectories: list[tuple[str, ...]] = trajs
        self.dtype = dtype

        # contexts and their actions, in first-appearance order
        keys: list[Hashable] = []
        key_id: dict[Hashable, int] = {}
        actions: list[list[str]] = []
        act_id: list[dict[str, int]] = []
        steps: list[list[tuple[int, int]]] = []
        for tau in trajs:
            row = []
            for t, tok in enumerate(tau):
                key: Hashable = tau[:t] if context == "prefix" else t
                if key not in key_id:
                    key_id[key] = len(keys)
                    keys.append(key)
                    actions.append([])
                    act_id.append({})
                c = key_id[key]
                if tok not in act_id[c]:
                    act_id[c][tok] = len(actions[c])
                    actions[c].append(tok)
                row.append((c, act_id[c][tok]))
            steps.append(row)
        if context == "position":
            n_product = 1
            for acts in actions:
                n_product *= len(acts)
            lengths = {len(tau) for tau in trajs}
            if len(lengths) != 1 or n_product != len(trajs):
                raise ValueError(
                    "context='position' needs the support to be the full product of the tokens seen at each "
                    f"position (all of one length): got {len(trajs)} trajectories of lengths {sorted(lengths)} "
                    f"but the product has {n_product}; use context='prefix' or list every combination"
                )
        self.context_keys: list[Hashable] = keys
        self._key_id = key_id
        self.actions: list[tuple[str, ...]] = [tuple(a) for a in actions]
        self._act_id = act_id

        n, t_max = len(trajs), max(len(tau) for tau in trajs)
        c_n, k_n = len(keys), max(len(a) for a in actions)
        self.N, self.T, self.C, self.K = n, t_max, c_n, k_n
        ctx = torch.zeros((n, t_max), dtype=torch.long)
        act = torch.zeros((n, t_max), dtype=torch.long)
        mask = torch.zeros((n, t_max), dtype=dtype)
        for i, row in enumerate(steps):
            for t, (c, a) in enumerate(row):
                ctx[i, t], act[i, t], mask[i, t] = c, a, 1.0
        self.ctx, self.act, self.mask = ctx, act, mask
        self.valid_steps = mask.bool()
        self.lengths = mask.sum(-1)
        self.rewards = torch.tensor([float(r) for r in rewards], dtype=dtype)
        if not bool(torch.isfinite(self.rewards).all()):
            raise ValueError("`rewards` contains NaN/inf")
        self.valid = torch.zeros((c_n, k_n), dtype=torch.bool)
        for c, acts in enumerate(actions):
            self.valid[c, : len(acts)] = True
        # DFPO eq. (71): equal (context, action) ⇒ equal score direction; −1 marks padding
        self.event_keys = torch.where(self.valid_steps, ctx * k_n + act, torch.full_like(ctx, -1))
        # flat (step -> context) incidence, used for exact visit probabilities
        self._flat_traj = torch.arange(n)[:, None].expand(n, t_max)[self.valid_steps]
        self._flat_ctx = ctx[self.valid_steps]
        # the prefix tree (in both modes): node 0 is the empty prefix; a node's context is its prefix
        # (``prefix`` mode) or its depth (``position`` mode). ``sample_from_uniforms`` walks it
        node_id: dict[tuple[str, ...], int] = {(): 0}
        node_ctx, node_traj, edges = [0], [-1], []
        for i, (tau, row) in enumerate(zip(trajs, steps, strict=True)):
            for t, (c, a) in enumerate(row):
                parent = node_id[tau[:t]]
                node_ctx[parent] = c
                child = node_id.setdefault(tau[: t + 1], len(node_ctx))
                if child == len(node_ctx):
                    node_ctx.append(0)
                    node_traj.append(-1)
                edges.append((parent, a, child))
            node_traj[node_id[tau]] = i
        n_nodes = len(node_ctx)
        # child node of (node, action slot); −1 on a slot the node's context does not have; a leaf
        # (a complete trajectory) is absorbing: every slot leads back to it
        node_child = torch.full((n_nodes, k_n), -1, dtype=torch.long)
        for parent, a, child in edges:
            node_child[parent, a] = child
        self._node_traj = torch.tensor(node_traj, dtype=torch.long)  # (M,) trajectory of a leaf, −1 inside
        leaves = torch.nonzero(self._node_traj >= 0).flatten()
        node_child[leaves] = leaves[:, None]
        self._node_ctx = torch.tensor(node_ctx, dtype=torch.long)  # (M,) context of a node (0 at a leaf)
        self._node_child = node_child
        # ``position`` mode, the same walk in one pass: position t's context is the same for every row, so
        # every position's action is drawn at once and the actions' mixed-radix code indexes the
        # trajectory (the support is the full product, so every code is a trajectory)
        self._pos_lookup: Tensor | None = None
        if context == "position":
            self._pos_ctx = torch.tensor([key_id[t] for t in range(t_max)], dtype=torch.long)  # (T,)
            radix = self.valid[self._pos_ctx].sum(-1)  # (T,) actions per position
            self._pos_stride = torch.flip(torch.cumprod(torch.flip(radix, (0,)), 0), (0,)).roll(-1, 0)
            self._pos_stride[-1] = 1  # (T,) Π of the later positions' radices
            lookup = torch.full((n,), -1, dtype=torch.long)
            lookup[(act * self._pos_stride).sum(-1)] = torch.arange(n)
            self._pos_lookup = lookup
        eq = [int(i) for i in equivalent]
        for i in eq:
            if not 0 <= i < n:
                raise ValueError(f"`equivalent` index {i} is outside the support (N={n})")
        self.equivalent = torch.tensor(eq, dtype=torch.long)

    # ------------------------------------------------------------------------------------------
    # parameters

    def uniform_logits(self) -> Tensor:
        """(C, K) logits of the uniform policy: 0 in used slots, −inf elsewhere."""
        zeros = torch.zeros((self.C, self.K), dtype=self.dtype)
        return torch.where(self.valid, zeros, torch.full_like(zeros, float("-inf")))

    def context_id(self, key: Hashable) -> int:
        """The id of a context key (a prefix tuple in ``prefix`` mode, a step index in ``position`` mode)."""
        if self.context_mode == "prefix" and isinstance(key, list):
            key = tuple(key)
        try:
            return self._key_id[key]
        except KeyError:
            shown = ", ".join(repr(k) for k in self.context_keys[:8])
            raise ValueError(f"unknown context {key!r}; valid contexts include: {shown}") from None

    def context_ids(self, keys: Sequence[Hashable]) -> Tensor:
        """(len(keys),) long ids of several context keys."""
        return torch.tensor([self.context_id(k) for k in keys], dtype=torch.long)

    def logits_from_probs(
        self, probs: Mapping[Hashable, Mapping[str, float]], base: Tensor | None = None
    ) -> Tensor:
        """Build (C, K) logits log π from per-context probability dicts.

        Args:
            probs: ``{context key: {token: probability}}``. Each listed context must give every one of
                its actions a probability in (0, 1], summing to 1 (within 1e-9).
            base: (C, K) logits for the contexts not listed (uniform when None).
        Returns:
            (C, K) logits; a listed context gets exactly log p (so softmax gives p back).
        """
        logits = self.uniform_logits() if base is None else base.detach().clone().to(self.dtype)
        for key, dist in probs.items():
            c = self.context_id(key)
            acts = self.actions[c]
            missing = [a for a in acts if a not in dist]
            extra = [a for a in dist if a not in self._act_id[c]]
            if missing or extra:
                raise ValueError(
                    f"context {key!r} has actions {list(acts)}; probabilities missing for {missing}, "
                    f"unknown tokens {extra}"
                )
            p = torch.tensor([float(dist[a]) for a in acts], dtype=self.dtype)
            if not bool(((p > 0) & (p <= 1)).all()) or abs(float(p.sum()) - 1.0) > 1e-9:
                raise ValueError(
                    f"context {key!r}: probabilities must be in (0, 1] and sum to 1, got {dict(zip(acts, p.tolist(), strict=True))}"
                )
            logits[c, : len(acts)] = p.log()
        return logits

    def check_logits(self, logits: Tensor) -> None:
        """Raise unless ``logits`` is a (C, K) float tensor, finite in every used slot."""
        if not isinstance(logits, Tensor):
            raise TypeError(f"`logits` must be a torch.Tensor, got {type(logits).__name__}")
        if tuple(logits.shape) != (self.C, self.K):
            raise ValueError(
                f"`logits` must have shape (C, K) = {(self.C, self.K)}, got {tuple(logits.shape)}"
            )
        if not bool(torch.isfinite(logits[self.valid]).all()):
            raise ValueError("`logits` holds NaN/inf in a used slot; only unused slots may be −inf")

    # ------------------------------------------------------------------------------------------
    # log-probabilities

    def log_probs_table(self, logits: Tensor) -> Tensor:
        """(C, K) log π(a|h): log_softmax per context, −inf in unused slots."""
        return torch.log_softmax(logits, dim=-1)

    def probs_table(self, logits: Tensor) -> Tensor:
        """(C, K) π(a|h), 0 in unused slots."""
        return torch.softmax(logits, dim=-1)

    def token_logp(self, logits: Tensor, index: Tensor | None = None) -> Tensor:
        """log π(a_t|h_t) of every step: (N, T), or (B, T) for the trajectories ``index`` (B,); 0 on padding.

        Differentiable in ``logits``.
        """
        lsm = torch.log_softmax(logits, dim=-1)
        if index is None:
            return lsm[self.ctx, self.act] * self.mask
        return lsm[self.ctx[index], self.act[index]] * self.mask[index]

    def logits_grad(self, grad_logp: Tensor, index: Tensor, probs_table: Tensor) -> Tensor:
        """Backpropagate ∂L/∂logp (B, T) of the trajectories ``index`` (B,) to the (C, K) logits, in closed form.

        logp_{i,t} = log_softmax(z)[h, a]·m with h = ctx[i, t], a = act[i, t], so
        ∂L/∂z_{h,k} = Σ_{(i,t) at h} m_{i,t}·∂L/∂logp_{i,t}·(1[k = a_{i,t}] − π(k|h)). This equals
        autograd through ``token_logp`` (tested) at a fraction of its cost; the simulator uses it.

        Args:
            grad_logp: (B, T) ∂L/∂logp.
            index: (B,) trajectory indices.
            probs_table: (C, K) π(k|h) at the current logits (``probs_table``).
        Returns:
            (C, K) ∂L/∂z, 0 in unused slots.
        """
        g = torch.zeros((self.C, self.K), dtype=grad_logp.dtype)
        g.index_put_((self.ctx[index], self.act[index]), grad_logp * self.mask[index], accumulate=True)
        return g - probs_table * g.sum(-1, keepdim=True)

    def stats(
        self, logits: Tensor, ref_logits: Tensor | None = None, contexts: Tensor | None = None
    ) -> dict[str, float]:
        """All exact statistics at once (one pass; the simulator's per-step row).

        Returns ``expected_reward``, ``entropy``, ``equiv_entropy`` and ``equiv_log_odds`` (NaN without an
        equivalent set of ≥ 2 members), and ``kl`` = ``kl_to(logits, ref_logits, contexts)`` (0.0 when
        ``ref_logits`` is None or ``contexts`` is empty).
        """
        with torch.no_grad():
            lsm = torch.log_softmax(logits, -1)
            lp = (lsm[self.ctx, self.act] * self.mask).sum(-1)
            p = lp.exp()
            out = {"expected_reward": float(p @ self.rewards), "entropy": float(-(p * lp).sum())}
            if self.equivalent.numel() >= 2:
                le = lp[self.equivalent]
                lq = le - torch.logsumexp(le, 0)
                out["equiv_entropy"] = float(-(lq.exp() * lq).sum())
                out["equiv_log_odds"] = float(le[0] - le[1])
            else:
                out["equiv_entropy"] = out["equiv_log_odds"] = float("nan")
            kl = 0.0
            if ref_logits is not None and (contexts is None or len(contexts) > 0):
                d = torch.zeros(self.C, dtype=p.dtype).index_add_(0, self._flat_ctx, p[self._flat_traj])
                lq_t = torch.log_softmax(ref_logits, -1)
                pt = lsm.exp()
                ckl = torch.where(self.valid, pt * (lsm - lq_t), torch.zeros_like(pt)).sum(-1)
                per = d * ckl
                kl = float(
                    per.sum() if contexts is None else per[torch.as_tensor(contexts, dtype=torch.long)].sum()
                )
            out["kl"] = kl
            return out

    def traj_logp(self, logits: Tensor) -> Tensor:
        """(N,) log π(τ) = Σ_t log π(a_t|h_t)."""
        return self.token_logp(logits).sum(-1)

    def probs(self, logits: Tensor) -> Tensor:
        """(N,) exact trajectory probabilities (they sum to 1)."""
        return self.traj_logp(logits).exp()

    def sample(self, n: int, logits: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Draw ``n`` trajectories (with replacement): (n,) long indices into the support.

        Drawing the index from the exact trajectory distribution π(τ) = Π_t π(a_t|h_t) is distributed
        exactly as sampling token by token until the end token: the support is the set of leaves of
        the generation tree (``position`` mode: the full product), and a leaf's probability under
        step-by-step sampling is that product. One ``torch.multinomial`` call replaces T sampling steps.
        The simulators (``simulate``, ``simulate_seeds``) sample with ``sample_from_uniforms`` instead:
        the same distribution, but one uniform per token position, which pairs two policies' draws.
        """
        with torch.no_grad():
            p = self.probs(logits.detach())
        return torch.multinomial(p, n, replacement=True, generator=generator)

    def sample_from_uniforms(self, logits: Tensor, u: Tensor) -> Tensor:
        """Sample trajectories token by token, each position's token from its own uniform (inverse CDF).

        Row b starts at the empty prefix; at position t its context h_t (the prefix, or t in ``position``
        mode) picks the action a_t whose cumulative-probability interval [F(a−1|h_t), F(a|h_t)) holds
        u[b, t] (F the normalised cumsum of π(·|h_t) over its action slots, a slot of probability 0 is
        never picked), and a_t leads to the next prefix. Once a row reaches the end of a trajectory its
        remaining uniforms are ignored (every row has T uniforms, T the longest trajectory). With the
        u[b, t] i.i.d. uniform on [0, 1) the row's trajectory τ has probability Π_t π(a_t|h_t) = π(τ):
        exactly the policy's trajectory distribution (tested by exact measure on a grid of uniforms).

        Common random numbers: a change of the policy moves only the boundaries of the contexts it
        changes, and each position's token depends on its own uniform, so two policies given the same
        uniforms draw mostly the same tokens (unlike one uniform inverted over all N trajectories).

        Args:
            logits: (C, K) logits, or (*L, C, K) one table per leading index (e.g. per seed).
            u: (B, T) float uniforms in [0, 1), or (*L, B, T) with the same leading shape as ``logits``.
        Returns:
            (B,) or (*L, B) long indices into the support.
        """
        if u.dim() < 2 or u.shape[-1] != self.T or tuple(u.shape[:-2]) != tuple(logits.shape[:-2]):
            raise ValueError(
                f"`u` must have shape (*L, B, T) with T = {self.T} and the leading shape of `logits` "
                f"{tuple(logits.shape[:-2])}; got {tuple(u.shape)}"
            )
        with torch.no_grad():
            z = logits.detach()
            c = torch.cumsum((z - z.amax(-1, keepdim=True)).exp(), -1)  # unnormalised; −inf slots add 0
            cdf = c / c[..., -1:]  # (*L, C, K) normalised per context; the last used slot is exactly 1

            def first_above(f: Tensor, x: Tensor) -> Tensor:
                # the first slot whose F exceeds x: the count of slots with F ≤ x (x < 1 = the last used
                # slot's F, so only the K − 1 first slots can count; a slot of probability 0 has the F
                # of the slot before it, so it is never the first above x)
                a = (x >= f[..., 0]).long()
                for k in range(1, self.K - 1):
                    a += x >= f[..., k]
                return a

            if self._pos_lookup is not None:  # position mode: every position at once
                rows = cdf[..., self._pos_ctx, :].unsqueeze(-3)  # (*L, 1, T, K)
                a = first_above(rows, u)  # (*L, B, T)
                return self._pos_lookup[(a * self._pos_stride).sum(-1)]
            node = torch.zeros(u.shape[:-1], dtype=torch.long)  # (*L, B) every row at the empty prefix
            for t in range(self.T):
                rows = torch.take_along_dim(cdf, self._node_ctx[node][..., None], dim=-2)  # (*L, B, K)
                node = self._node_child[node, first_above(rows, u[..., t])]
            return self._node_traj[node]

    # ------------------------------------------------------------------------------------------
    # exact statistics (floats)

    def expected_reward(self, logits: Tensor) -> float:
        """E_π[R] by enumeration."""
        with torch.no_grad():
            return float(self.probs(logits) @ self.rewards)

    def entropy(self, logits: Tensor) -> float:
        """Trajectory entropy −Σ_τ π(τ) log π(τ) in nats (every listed trajectory has π(τ) > 0)."""
        with torch.no_grad():
            lp = self.traj_logp(logits)
            return float(-(lp.exp() * lp).sum())

    def context_visit_probs(self, logits: Tensor) -> Tensor:
        """(C,) d_π(h): the probability that a trajectory drawn from π passes through context h.

        Each trajectory visits a context at most once (a prefix, or a position), so d(h) is the sum of
        π(τ) over the trajectories with a step at h.
        """
        with torch.no_grad():
            p = self.probs(logits)
            d = torch.zeros(self.C, dtype=p.dtype)
            return d.index_add_(0, self._flat_ctx, p[self._flat_traj])

    def context_kl(self, logits: Tensor, ref_logits: Tensor) -> Tensor:
        """(C,) KL(π(·|h) ‖ π_ref(·|h)) of every context (nats)."""
        with torch.no_grad():
            lp = torch.log_softmax(logits, -1)
            lq = torch.log_softmax(ref_logits, -1)
            p = lp.exp()
            terms = torch.where(self.valid, p * (lp - lq), torch.zeros_like(p))
            return terms.sum(-1)

    def kl_to(
        self, logits: Tensor, ref_logits: Tensor, contexts: Sequence[int] | Tensor | None = None
    ) -> float:
        """Σ_{h ∈ contexts} d_π(h)·KL(π(·|h) ‖ π_ref(·|h)): the exact KL drift over a set of contexts.

        Over all contexts (``contexts=None``) this is the trajectory-level KL(π ‖ π_ref) by the chain
        rule of KL (each trajectory visits a context at most once); over a subset it is the part of that
        KL spent on those contexts, e.g. the reward-irrelevant template contexts (learning tax).

        Args:
            contexts: context ids (see ``context_ids``), or None for all.
        """
        per = self.context_visit_probs(logits) * self.context_kl(logits, ref_logits)
        if contexts is None:
            return float(per.sum())
        idx = torch.as_tensor(contexts, dtype=torch.long)
        return float(per[idx].sum())

    def trajectory_kl(self, logits: Tensor, ref_logits: Tensor) -> float:
        """KL(π ‖ π_ref) over whole trajectories, by enumeration: Σ_τ π(τ) log π(τ)/π_ref(τ)."""
        with torch.no_grad():
            lp = self.traj_logp(logits)
            lq = self.traj_logp(ref_logits)
            return float((lp.exp() * (lp - lq)).sum())

    def _need_equivalent(self, k: int) -> None:
        if self.equivalent.numel() < k:
            raise ValueError(
                f"this policy's equivalent set has {self.equivalent.numel()} members; need ≥ {k}"
            )

    def equiv_entropy(self, logits: Tensor) -> float:
        """Entropy (nats) of π renormalised over the equivalent-correct set: 0 means collapse onto one form."""
        self._need_equivalent(2)
        with torch.no_grad():
            lp = self.traj_logp(logits)[self.equivalent]
            lq = lp - torch.logsumexp(lp, 0)
            return float(-(lq.exp() * lq).sum())

    def equiv_log_odds(self, logits: Tensor) -> float:
        """log π(τa) − log π(τb) for the first two members of the equivalent set (DFPO eq. 41's left side)."""
        self._need_equivalent(2)
        with torch.no_grad():
            lp = self.traj_logp(logits)
            return float(lp[self.equivalent[0]] - lp[self.equivalent[1]])

    # ------------------------------------------------------------------------------------------
    # presentation

    def trajectory_index(self, tau: Sequence[str]) -> int:
        """Index of a trajectory in the support (ValueError if it is not listed)."""
        key = tuple(tau)
        try:
            return self.trajectories.index(key)
        except ValueError:
            raise ValueError(f"trajectory {key} is not in the support") from None

    def text(self, i: int) -> str:
        """The tokens of trajectory ``i`` joined by spaces."""
        return " ".join(self.trajectories[i])

    def context_table(self, logits: Tensor) -> list[dict[str, object]]:
        """One row per (context, action): ``context``, ``token``, ``prob`` (for display)."""
        p = self.probs_table(logits.detach())
        return [
            {"context": self.context_keys[c], "token": a, "prob": float(p[c, k])}
            for c, acts in enumerate(self.actions)
            for k, a in enumerate(acts)
        ]


__all__ = ["CONTEXT_MODES", "TabularPolicy"]
