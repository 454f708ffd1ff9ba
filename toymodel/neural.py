"""A small neural policy over a toy scenario's trajectories: tokens couple through shared weights.

The tabular toy (``toymodel.policy``) has one free logit vector per context, so a token's score direction
∇θ log π(y) lives in its own context's row: two tokens couple only when they share a context, and the
coupling kernel of the cancellation-hypothesis paper ("The Cancellation Hypothesis in Critic-Free RL",
arXiv 2605.08666, eq. 5) is its output-layer proxy (eq. 7) with one-hot hidden states. Here the same
support, rewards and ctx/act/mask index tensors (a ``TabularPolicy`` supplies the structure) are scored
by a one-hidden-layer network, so tokens also couple through the weights every context shares:

    h_c = tanh(W1 e_c + b1)                       (d,)   the hidden state of context c
    z_c = W_out h_c (+ b_out)                     (V,)   logits over the global vocabulary
    π(·|c) = softmax(z_c restricted to the tokens that can follow c; −inf elsewhere)

- ``e_c`` (C, d_e): one embedding per context (a node of the prefix tree with ``context="prefix"``, a
  position with ``context="position"``: the structure's contexts);
- ``W1`` (d, d_e), ``b1`` (d,): the shared hidden layer;
- ``W_out`` (V, d): an *untied* unembedding over the global vocabulary (V = the distinct token strings of
  the support), so the same token string in two contexts uses the same row of W_out, as an LM's does;
  ``b_out`` (V,) only with ``out_bias=True`` (default off: then the gradient w.r.t. the output layer is
  exactly the paper's eq. 6, (e_y − π) hᵀ, and the proxy kernel of eq. 7 is its exact kernel).

The parameters are a list of leaf tensors (``param_names`` gives their order), passed to every method;
the object holds only the structure. float64 throughout. Everything exact is computed by enumeration of
the support (``probs``, ``expected_reward``).

Shapes: N trajectories in the support, B selected trajectories (``idx``), T the longest trajectory,
C contexts, K action slots of the structure, V global vocabulary, d_e embedding width, d hidden width.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .policy import CONTEXT_MODES, TabularPolicy
from .scenarios import Scenario, get_scenario


class NeuralPolicy:
    """The structure of a small neural policy over a scenario's support; parameters are passed in.

    Args:
        structure: a ``TabularPolicy`` giving the support, rewards, contexts and ctx/act/mask tensors.
        d_embed: d_e, the width of the context embeddings.
        d_hidden: d, the width of the hidden layer (and of the unembedding's rows).
        out_bias: add an output bias b_out (V,) to the logits (default False: a bias-free untied
            unembedding, so the output-layer proxy kernel is the exact kernel of W_out).
        scenario: the scenario the structure came from (``scenario_target`` needs it), or None.
    """

    def __init__(
        self,
        structure: TabularPolicy,
        *,
        d_embed: int = 8,
        d_hidden: int = 8,
        out_bias: bool = False,
        scenario: Scenario | None = None,
    ) -> None:
        if not isinstance(structure, TabularPolicy):
            raise TypeError(f"`structure` must be a TabularPolicy, got {type(structure).__name__}")
        for name, v in (("d_embed", d_embed), ("d_hidden", d_hidden)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"`{name}` must be a positive int, got {v!r}")
        self.structure = structure
        self.scenario = scenario
        self.d_embed, self.d_hidden, self.out_bias = d_embed, d_hidden, bool(out_bias)
        self.dtype = torch.float64
        # the global vocabulary: distinct token strings in first-appearance order over the contexts
        vocab: list[str] = []
        vid: dict[str, int] = {}
        for acts in structure.actions:
            for tok in acts:
                if tok not in vid:
                    vid[tok] = len(vocab)
                    vocab.append(tok)
        self.vocab: tuple[str, ...] = tuple(vocab)
        self._vocab_id = vid
        self.N, self.T, self.C, self.K, self.V = (
            structure.N,
            structure.T,
            structure.C,
            structure.K,
            len(vocab),
        )
        # slot_token[c, k]: global id of action slot k of context c (0 in unused slots, see `structure.valid`)
        slot = torch.zeros((self.C, self.K), dtype=torch.long)
        valid_vocab = torch.zeros((self.C, self.V), dtype=torch.bool)
        for c, acts in enumerate(structure.actions):
            for k, tok in enumerate(acts):
                slot[c, k] = vid[tok]
                valid_vocab[c, vid[tok]] = True
        self.slot_token = slot
        self.valid_vocab = valid_vocab
        self.ctx, self.act, self.mask = structure.ctx, structure.act, structure.mask.to(self.dtype)
        self.rewards = structure.rewards.to(self.dtype)
        tok = slot[structure.ctx, structure.act]
        self._tok = torch.where(structure.valid_steps, tok, torch.full_like(tok, -1))

    @classmethod
    def from_scenario(
        cls,
        scenario: str | Scenario,
        *,
        context: str | None = "prefix",
        d_embed: int = 8,
        d_hidden: int = 8,
        out_bias: bool = False,
    ) -> NeuralPolicy:
        """Build the net over a named scenario's support.

        Args:
            scenario: a name of ``toymodel.scenarios.SCENARIOS`` or a ``Scenario``.
            context: ``"prefix"`` (default): one embedding per prefix-tree node, so the hidden state depends
                on the whole prefix, as an LM's does, and the same token string after different prefixes
                has different hidden states but the same W_out row; ``"position"``: one per position (the
                support must be a full product); None: the scenario's own mode.
            d_embed, d_hidden, out_bias: as in the constructor.
        """
        sc = get_scenario(scenario)
        if context is None or context == sc.context:
            structure = sc.policy()
        elif context in CONTEXT_MODES:
            structure = TabularPolicy(sc.support, sc.rewards, context=context)
        else:
            raise ValueError(f"unknown context mode {context!r}; valid: None, {', '.join(CONTEXT_MODES)}")
        return cls(structure, d_embed=d_embed, d_hidden=d_hidden, out_bias=out_bias, scenario=sc)

    # ------------------------------------------------------------------------------------------
    # parameters

    @property
    def param_names(self) -> tuple[str, ...]:
        """Names of the parameter list, in order: embed (C, d_e), W1 (d, d_e), b1 (d,), W_out (V, d)[, b_out (V,)]."""
        return ("embed", "W1", "b1", "W_out", "b_out") if self.out_bias else ("embed", "W1", "b1", "W_out")

    @property
    def head_slice(self) -> slice:
        """The positions of the output layer (W_out, and b_out if any) in the parameter list."""
        return slice(3, len(self.param_names))

    def num_params(self) -> int:
        """P, the total number of scalar parameters."""
        d_e, d = self.d_embed, self.d_hidden
        return self.C * d_e + d * d_e + d + self.V * d + (self.V if self.out_bias else 0)

    def init_params(self, seed: int = 0, *, scale: float = 1.0) -> list[Tensor]:
        """Seeded random parameters: leaf float64 tensors that require grad, in ``param_names`` order.

        e ~ N(0, scale²), W1 ~ N(0, scale²/d_e), b1 ~ N(0, 0.1²·scale²), W_out ~ N(0, scale²/d), b_out = 0:
        a variance-preserving (LeCun) init, so pre-activations are O(1) and tanh is not saturated.
        """
        g = torch.Generator().manual_seed(int(seed))
        d_e, d = self.d_embed, self.d_hidden

        def randn(*shape: int) -> Tensor:
            return torch.randn(shape, generator=g, dtype=self.dtype)

        params = [
            randn(self.C, d_e) * scale,
            randn(d, d_e) * (scale / d_e**0.5),
            randn(d) * (0.1 * scale),
            randn(self.V, d) * (scale / d**0.5),
        ]
        if self.out_bias:
            params.append(torch.zeros(self.V, dtype=self.dtype))
        return [p.requires_grad_(True) for p in params]

    def check_params(self, params: Sequence[Tensor]) -> None:
        """Raise unless ``params`` is a list of tensors of the shapes ``param_names`` says."""
        d_e, d = self.d_embed, self.d_hidden
        shapes = [(self.C, d_e), (d, d_e), (d,), (self.V, d)] + ([(self.V,)] if self.out_bias else [])
        if len(params) != len(shapes):
            raise ValueError(
                f"`params` must hold {len(shapes)} tensors {self.param_names}, got {len(params)}"
            )
        for name, p, s in zip(self.param_names, params, shapes, strict=True):
            if not isinstance(p, Tensor):
                raise TypeError(f"`params` entry {name} must be a torch.Tensor, got {type(p).__name__}")
            if tuple(p.shape) != s:
                raise ValueError(f"`params` entry {name} must have shape {s}, got {tuple(p.shape)}")

    # ------------------------------------------------------------------------------------------
    # per-context tables

    def hidden_table(self, params: Sequence[Tensor]) -> Tensor:
        """(C, d) h_c = tanh(W1 e_c + b1) of every context."""
        self.check_params(params)
        embed, w1, b1 = params[0], params[1], params[2]
        return torch.tanh(embed @ w1.T + b1)

    def logits_table(self, params: Sequence[Tensor]) -> Tensor:
        """(C, V) z_c = W_out h_c (+ b_out), −inf outside the tokens that can follow context c."""
        z = self.hidden_table(params) @ params[3].T
        if self.out_bias:
            z = z + params[4]
        return z.masked_fill(~self.valid_vocab, float("-inf"))

    def log_probs_table(self, params: Sequence[Tensor]) -> Tensor:
        """(C, V) log π(v|c): −inf outside the valid set."""
        return torch.log_softmax(self.logits_table(params), dim=-1)

    def probs_table(self, params: Sequence[Tensor]) -> Tensor:
        """(C, V) π(v|c): 0 outside the valid set."""
        return torch.softmax(self.logits_table(params), dim=-1)

    # ------------------------------------------------------------------------------------------
    # per-token quantities of selected trajectories

    def _index(self, idx: Tensor | None) -> Tensor:
        if idx is None:
            return torch.arange(self.N)
        if not isinstance(idx, Tensor) or idx.dim() != 1 or idx.is_floating_point():
            raise ValueError("`idx` must be a (B,) integer tensor of trajectory indices (or None: all)")
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= self.N):
            raise ValueError(f"`idx` holds trajectory indices outside [0, N) with N={self.N}")
        return idx.long()

    def token_ids(self, idx: Tensor | None = None) -> Tensor:
        """(B, T) long: the global vocabulary id of each taken token, −1 on padding."""
        return self._tok[self._index(idx)]

    def step_mask(self, idx: Tensor | None = None) -> Tensor:
        """(B, T) float64: 1 on real steps, 0 on padding."""
        return self.mask[self._index(idx)]

    def _step_logits(self, params: Sequence[Tensor], ctx: Tensor) -> Tensor:
        """(..., V) the masked logits z_c at the contexts ``ctx`` (any shape): only those contexts are computed."""
        self.check_params(params)
        embed, w1, b1, w_out = params[0], params[1], params[2], params[3]
        h = torch.tanh(embed[ctx] @ w1.T + b1)
        z = h @ w_out.T
        if self.out_bias:
            z = z + params[4]
        return z.masked_fill(~self.valid_vocab[ctx], float("-inf"))

    def token_logp(self, params: Sequence[Tensor], idx: Tensor | None = None) -> Tensor:
        """(B, T) log π(y_t | c_t) of the taken tokens of trajectories ``idx`` (all when None); 0 on padding.

        Differentiable in ``params``. Computes the net only at the B·T steps of ``idx``.
        """
        i = self._index(idx)
        lsm = torch.log_softmax(self._step_logits(params, self.ctx[i]), dim=-1)  # (B, T, V)
        tok = self._tok[i].clamp_min(0)  # padding reads a finite entry of context 0's row, then × 0
        return lsm.gather(-1, tok[..., None]).squeeze(-1) * self.mask[i]

    def hidden(self, params: Sequence[Tensor], idx: Tensor | None = None) -> Tensor:
        """(B, T, d) the hidden state h (the unembedding's input) at each step; 0 on padding."""
        self.check_params(params)
        i = self._index(idx)
        embed, w1, b1 = params[0], params[1], params[2]
        return torch.tanh(embed[self.ctx[i]] @ w1.T + b1) * self.mask[i][..., None]

    def token_probs(self, params: Sequence[Tensor], idx: Tensor | None = None) -> Tensor:
        """(B, T, V) π(·|c_t) over the global vocabulary at each step (0 outside the valid set); 0 on padding."""
        i = self._index(idx)
        return torch.softmax(self._step_logits(params, self.ctx[i]), dim=-1) * self.mask[i][..., None]

    # ------------------------------------------------------------------------------------------
    # whole trajectories (exact, by enumeration)

    def traj_logp(self, params: Sequence[Tensor]) -> Tensor:
        """(N,) log π(τ) = Σ_t log π(y_t|c_t) of every trajectory of the support."""
        return self.token_logp(params).sum(-1)

    def probs(self, params: Sequence[Tensor]) -> Tensor:
        """(N,) exact trajectory probabilities (they sum to 1: the support is the set of leaves)."""
        return self.traj_logp(params).exp()

    def expected_reward(self, params: Sequence[Tensor]) -> float:
        """E_π[R] = Σ_τ π(τ) R(τ) by enumeration."""
        with torch.no_grad():
            return float(self.probs(params) @ self.rewards)

    def sample(self, n: int, params: Sequence[Tensor], generator: torch.Generator | None = None) -> Tensor:
        """Draw ``n`` trajectories with replacement: (n,) long indices into the support.

        Drawing from the exact π(τ) = Π_t π(y_t|c_t) is distributed as sampling token by token (see
        ``TabularPolicy.sample``). Pass a seeded ``torch.Generator`` for a reproducible draw.
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"`n` must be a positive int, got {n!r}")
        with torch.no_grad():
            p = self.probs([q.detach() for q in params])
        return torch.multinomial(p, n, replacement=True, generator=generator)

    # ------------------------------------------------------------------------------------------
    # matching a tabular distribution

    def scenario_target(self) -> Tensor:
        """(C, V) the scenario's initial per-context distribution, mapped onto this net's contexts.

        A prefix-tree context of a scenario in ``position`` mode takes the distribution of its position
        (its prefix length); in the scenario's own mode the contexts are the same.
        """
        sc = self.scenario
        if sc is None:
            raise ValueError("this NeuralPolicy was not built by `from_scenario`: it has no scenario target")
        tab = sc.policy()
        ptab = tab.probs_table(sc.initial_logits())
        mine = self.structure
        if mine.context_mode != tab.context_mode and mine.context_mode != "prefix":
            raise ValueError("a scenario target maps onto prefix-tree or same-mode contexts only")
        target = torch.zeros((self.C, self.V), dtype=self.dtype)
        for c, key in enumerate(mine.context_keys):
            skey = key if mine.context_mode == tab.context_mode else len(key)  # type: ignore[arg-type]
            sc_c = tab.context_id(skey)
            for tok in mine.actions[c]:
                target[c, self._vocab_id[tok]] = ptab[sc_c, tab.actions[sc_c].index(tok)]
        return target / target.sum(-1, keepdim=True)

    def fit(
        self, params: Sequence[Tensor], target: Tensor, *, steps: int = 300, lr: float = 0.05
    ) -> tuple[list[Tensor], float]:
        """Fit the net to a per-context target distribution by Adam on the mean KL(target_c ‖ π_c).

        A deterministic function of its inputs (full-batch Adam, fixed step count). Used to start the net
        near a scenario's initial policy (``scenario_target``), so its confidences spread the way the
        scenario's do (e.g. 0.7 / 0.2 / 0.1 on ``template_task``'s template positions).

        Args:
            params: the starting parameters (not modified).
            target: (C, V) probabilities, 0 outside each context's valid set, rows summing to 1.
            steps: Adam steps.
            lr: Adam's learning rate.
        Returns:
            (the fitted parameters as new leaf tensors requiring grad, the final mean KL in nats).
        """
        if tuple(target.shape) != (self.C, self.V):
            raise ValueError(
                f"`target` must have shape (C, V) = {(self.C, self.V)}, got {tuple(target.shape)}"
            )
        if bool((target[~self.valid_vocab] != 0).any()):
            raise ValueError("`target` puts mass on a token that cannot follow its context")
        theta = [p.detach().clone().requires_grad_(True) for p in params]
        opt = torch.optim.Adam(theta, lr=lr)
        t = target.to(self.dtype)
        log_t = torch.where(t > 0, t.log(), torch.zeros_like(t))

        def kl(th: list[Tensor]) -> Tensor:
            lsm = self.log_probs_table(th)
            lsm = torch.where(self.valid_vocab, lsm, torch.zeros_like(lsm))
            return (t * (log_t - lsm)).sum(-1).mean()

        for _ in range(int(steps)):
            opt.zero_grad()
            loss = kl(theta)
            loss.backward()
            opt.step()
        with torch.no_grad():
            final = float(kl(theta))
        return [p.detach().clone().requires_grad_(True) for p in theta], final


__all__ = ["NeuralPolicy"]
