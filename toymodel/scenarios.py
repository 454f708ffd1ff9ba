"""The toy problems of the DFPO paper (App. A, App. F) and a template task, as named scenarios.

Each scenario is a frozen ``Scenario``: its support (every complete trajectory), rewards, context
mode, initial probabilities, equivalent-correct set and template contexts. ``SCENARIOS`` maps names to
scenarios; ``get_scenario(name)`` looks one up. ``shared_prefix_policies`` and
``clip_asymmetry_policies`` build the exact (θ, θ_old) pairs that the paper's closed forms assume.

| name | paper | what it shows |
|---|---|---|
| ``shared_prefix`` | App. A.2, eq. (32)–(38) | sequence coupling leaves a non-zero shared-prefix coefficient |
| ``equivalent_solutions`` | App. A.1/A.3, eq. (25)–(30), (39)–(41) | s₂ ≠ s₃ drifts the odds of two equally correct answers |
| ``clip_asymmetry`` | App. F, eq. (75)–(76); App. H eq. (82) | sign-dependent clipping breaks cancellation; symmetric clipping restores it |
| ``template_task`` | App. G, App. E (learning tax) | drift on reward-irrelevant template tokens, measured as exact KL |
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from functools import cache
from types import MappingProxyType

import torch
from torch import Tensor

from cancellation.diagnostics import token_coefficients

from .policy import TabularPolicy


@dataclass(frozen=True, eq=False)
class Scenario:
    """A named toy problem.

    Attributes:
        name: registry name.
        description: one paragraph: what the scenario is and what to look at.
        reference: where it comes from in the papers.
        support: every complete trajectory (tuples of token strings).
        rewards: one reward per trajectory.
        context: ``"prefix"`` or ``"position"`` (see ``toymodel.policy``).
        initial: ``{context key: {token: prob}}`` of the initial policy; unlisted contexts are uniform.
        equivalent: the equivalent-correct trajectories (same reward, different surface forms); the
            first two define ``equiv_log_odds``.
        template_contexts: context keys whose choice is independent of the reward for every θ, so the
            exact policy gradient on them is always 0 and any drift there is learning tax. Only
            ``template_task`` has them: in the prefix-tree scenarios an early choice changes which later
            context is reached, hence the reward distribution, as soon as those contexts differ.
    """

    name: str
    description: str
    reference: str
    support: tuple[tuple[str, ...], ...]
    rewards: tuple[float, ...]
    context: str = "prefix"
    initial: Mapping[Hashable, Mapping[str, float]] = field(default_factory=dict)
    equivalent: tuple[tuple[str, ...], ...] = ()
    template_contexts: tuple[Hashable, ...] = ()

    def policy(self) -> TabularPolicy:
        """The scenario's ``TabularPolicy`` (built once, then cached)."""
        return _policy_of(self)

    def initial_logits(self) -> Tensor:
        """(C, K) logits of the initial policy (a fresh tensor each call)."""
        return self.policy().logits_from_probs(self.initial)

    def template_context_ids(self) -> Tensor:
        """(n,) long ids of the template contexts (empty when the scenario has none)."""
        return self.policy().context_ids(self.template_contexts)


@cache
def _policy_of(scenario: Scenario) -> TabularPolicy:
    index = {tau: i for i, tau in enumerate(scenario.support)}
    missing = [tau for tau in scenario.equivalent if tau not in index]
    if missing:
        raise ValueError(
            f"scenario {scenario.name!r}: equivalent trajectories {missing} are not in the support"
        )
    return TabularPolicy(
        scenario.support,
        scenario.rewards,
        context=scenario.context,
        equivalent=[index[tau] for tau in scenario.equivalent],
    )


def _frozen(d: Mapping[Hashable, Mapping[str, float]]) -> Mapping[Hashable, Mapping[str, float]]:
    return MappingProxyType({k: MappingProxyType(dict(v)) for k, v in d.items()})


# ----------------------------------------------------------------------------------------------
# App. A.2: shared prefix (G = 2, T = 3)

_SP_FIRST = ("answer", "result")
_SP_SECOND = ("is", "was")
_SP_LAST = ("25", "20", "30")
_SP_SUPPORT = tuple(itertools.product(_SP_FIRST, _SP_SECOND, _SP_LAST))

SHARED_PREFIX = Scenario(
    name="shared_prefix",
    description=(
        "Two completions 'answer is 25' (R=0) and 'answer is 20' (R=1) share the prefix 'answer is'. "
        "Alternatives at every step (answer/result, is/was, 25/20/30) let every ratio move, giving 12 "
        "trajectories of exactly 3 tokens (the last token is terminal; no end token). Reward 1 iff the "
        "last token is '20'. Under sequence-coupled weights s_i = Π_t r_{i,t}, the shared prefix tokens get "
        "the net coefficient A·ρ1·ρ2·(λ2 − λ1) (eq. 38), not 0: learning tax on reward-unrelated tokens."
    ),
    reference="DFPO App. A.2, eq. (32)-(38)",
    support=_SP_SUPPORT,
    rewards=tuple(1.0 if tau[-1] == "20" else 0.0 for tau in _SP_SUPPORT),
    initial=_frozen(
        {
            (): {"answer": 0.5, "result": 0.5},
            ("answer",): {"is": 0.5, "was": 0.5},
            ("result",): {"is": 0.5, "was": 0.5},
            **{(a, b): {"25": 0.3, "20": 0.3, "30": 0.4} for a in _SP_FIRST for b in _SP_SECOND},
        }
    ),
    equivalent=tuple(tau for tau in _SP_SUPPORT if tau[-1] == "20"),
)


def shared_prefix_policies(rho1: float, rho2: float, lam1: float, lam2: float) -> tuple[Tensor, Tensor]:
    """(logits, old_logits) on ``shared_prefix`` with the exact ratios of DFPO eq. (35)-(36).

    π_old is the scenario's initial policy: π(answer)=0.5, π(is|answer)=0.5, π(25|·)=0.3, π(20|·)=0.3,
    π(30|·)=0.4 after every two-token prefix. π_θ differs only on the path of
    τ1 = (answer, is, 25) and τ2 = (answer, is, 20), so that

        r_{1,1} = r_{2,1} = ρ1,  r_{1,2} = r_{2,2} = ρ2,  r_{1,3} = λ1,  r_{2,3} = λ2.

    The leftover mass goes to the alternatives (result, was, 30), so the values must satisfy
    0 < ρ1 < 2, 0 < ρ2 < 2, λ1, λ2 > 0 and 0.3·(λ1 + λ2) < 1; anything else raises ValueError.
    """
    rho1, rho2, lam1, lam2 = float(rho1), float(rho2), float(lam1), float(lam2)
    if not (0.0 < rho1 < 2.0 and 0.0 < rho2 < 2.0):
        raise ValueError(
            f"ρ1 and ρ2 must be in (0, 2) (π_old = 0.5 at steps 1 and 2), got ρ1={rho1}, ρ2={rho2}"
        )
    if not (lam1 > 0.0 and lam2 > 0.0 and 0.3 * (lam1 + lam2) < 1.0):
        raise ValueError(
            f"λ1, λ2 must be > 0 with 0.3·(λ1 + λ2) < 1 (π_old(25) = π_old(20) = 0.3 and '30' keeps the rest), "
            f"got λ1={lam1}, λ2={lam2}"
        )
    policy = SHARED_PREFIX.policy()
    old = SHARED_PREFIX.initial_logits()
    p1, p2 = 0.5 * rho1, 0.5 * rho2
    q1, q2 = 0.3 * lam1, 0.3 * lam2
    new = policy.logits_from_probs(
        {
            (): {"answer": p1, "result": 1.0 - p1},
            ("answer",): {"is": p2, "was": 1.0 - p2},
            ("answer", "is"): {"25": q1, "20": q2, "30": 1.0 - q1 - q2},
        },
        base=old,
    )
    return new, old


def pair_coefficients(
    scenario: Scenario,
    taus: tuple[tuple[str, ...], tuple[str, ...]],
    logits: Tensor,
    old_logits: Tensor,
    advantage: float,
    objective: str,
    **params: object,
) -> Tensor:
    """(2, T) ∂J/∂logp of the group {τ1, τ2} with Â = (−A, +A) (eq. 32), under π_θ = ``logits``, π_old."""
    policy = scenario.policy()
    idx = torch.tensor([policy.trajectory_index(taus[0]), policy.trajectory_index(taus[1])])
    adv = torch.tensor([-advantage, advantage], dtype=policy.dtype)
    return token_coefficients(
        objective,
        policy.token_logp(logits, idx),
        policy.token_logp(old_logits, idx),
        adv,
        policy.mask[idx],
        torch.zeros(2, dtype=torch.long),
        **params,
    )


def shared_prefix_coefficients(
    objective: str,
    rho1: float,
    rho2: float,
    lam1: float,
    lam2: float,
    advantage: float = 1.0,
    **params: object,
) -> Tensor:
    """(2, 3) ∂J/∂logp of τ1 = "answer is 25" (Â = −A) and τ2 = "answer is 20" (Â = +A) at t = 1, 2, 3."""
    new, old = shared_prefix_policies(rho1, rho2, lam1, lam2)
    taus = (("answer", "is", "25"), ("answer", "is", "20"))
    return pair_coefficients(SHARED_PREFIX, taus, new, old, advantage, objective, **params)


def shared_prefix_net(
    objective: str,
    rho1: float,
    rho2: float,
    lam1: float,
    lam2: float,
    advantage: float = 1.0,
    **params: object,
) -> tuple[float, float]:
    """Net coefficient Σ_i ∂J/∂logp_{i,t} of the two shared prefix steps (t = 1, 2) of DFPO App. A.2.

    The batch is the group {τ1 = (answer, is, 25), τ2 = (answer, is, 20)} with Â = (−A, +A) (eq. 32),
    π_θ and π_old from ``shared_prefix_policies``; ``params`` go to the objective (e.g.
    ``length_norm=False`` and a huge clip range for eq. 38's closed form A·ρ1·ρ2·(λ2 − λ1)/G).
    """
    coef = shared_prefix_coefficients(objective, rho1, rho2, lam1, lam2, advantage, **params)
    net = coef.sum(0)  # both trajectories share steps 1 and 2: same context, same token
    return float(net[0]), float(net[1])


# ----------------------------------------------------------------------------------------------
# App. A.1 / A.3: equivalent solutions

_TAU1 = ("The", "answer", "is", "25", ".")
_TAU2 = ("The", "answer", "is", "20", ".")
_TAU3 = ("10", "+", "10", "=", "20", ".")

EQUIVALENT_SOLUTIONS = Scenario(
    name="equivalent_solutions",
    description=(
        "Prompt 'What is 10+10?'. τ1 'The answer is 25 .' (R=0), τ2 'The answer is 20 .' (R=1), "
        "τ3 '10 + 10 = 20 .' (R=1); '.' is the end token. τ2 and τ3 are equally correct but differ in "
        "length (5 vs 6 tokens) and local likelihood, so their sequence weights s2 ≠ s3 and GSPO drifts "
        "their log-odds (eq. 41) until one surface form takes all the mass: entropy collapse on the "
        "equivalent set {τ2, τ3}. The prefix tree has two choice points: the first token (The / 10) and "
        "the answer after 'The answer is' (25 / 20); every other step has one action. Uniform start: "
        "π(τ1)=π(τ2)=0.25, π(τ3)=0.5, E[R]=0.75."
    ),
    reference="DFPO App. A.1 eq. (25)-(30), App. A.3 eq. (39)-(41)",
    support=(_TAU1, _TAU2, _TAU3),
    rewards=(0.0, 1.0, 1.0),
    equivalent=(_TAU2, _TAU3),
)


# ----------------------------------------------------------------------------------------------
# App. F: clip asymmetry

_CA_SUPPORT = (("answer", "25"), ("answer", "20"), ("result", "25"), ("result", "20"))

CLIP_ASYMMETRY = Scenario(
    name="clip_asymmetry",
    description=(
        "A shared first token 'answer' (its ratio w can be set) then a deciding token: τ1 (answer, 25) "
        "R=0, τ2 (answer, 20) R=1; the alternative first token 'result' lets w move. When w leaves "
        "[1−ε, 1+ε], GRPO's min/clip takes different branches for Â > 0 and Â < 0, so the shared "
        "token's coefficients no longer cancel (eq. 75-76); symmetric clipping clip(r, 0, 1+ε) restores "
        "cancellation (App. H eq. 82). Two tokens per trajectory, no end token."
    ),
    reference="DFPO App. F eq. (75)-(76), App. H eq. (79)-(82)",
    support=_CA_SUPPORT,
    rewards=tuple(1.0 if tau[-1] == "20" else 0.0 for tau in _CA_SUPPORT),
    equivalent=(("answer", "20"), ("result", "20")),
)


def clip_asymmetry_policies(w: float) -> tuple[Tensor, Tensor]:
    """(logits, old_logits) on ``clip_asymmetry`` with ratio w on the shared first token 'answer'.

    π_old is uniform (π_old(answer) = 0.5, π_old(20|answer) = 0.5); π_θ(answer) = 0.5·w and everything
    else equals π_old, so the deciding tokens have ratio 1. Needs 0 < w < 2.
    """
    w = float(w)
    if not 0.0 < w < 2.0:
        raise ValueError(f"w must be in (0, 2) (π_old(answer) = 0.5), got {w}")
    policy = CLIP_ASYMMETRY.policy()
    old = CLIP_ASYMMETRY.initial_logits()
    new = policy.logits_from_probs({(): {"answer": 0.5 * w, "result": 1.0 - 0.5 * w}}, base=old)
    return new, old


def clip_asymmetry_net(objective: str, w: float, advantage: float = 1.0, **params: object) -> float:
    """Net coefficient Σ_i ∂J/∂logp of the shared first token of DFPO App. F (ratio w), for Â = (−A, +A)."""
    new, old = clip_asymmetry_policies(w)
    coef = pair_coefficients(
        CLIP_ASYMMETRY, (("answer", "25"), ("answer", "20")), new, old, advantage, objective, **params
    )
    return float(coef[:, 0].sum())


# ----------------------------------------------------------------------------------------------
# template task (learning tax)

TEMPLATE_SYNONYMS = (
    ("Let's", "Let us", "We"),
    ("compute", "calculate", "evaluate"),
    ("the", "this", "our"),
    ("sum", "total", "result"),
    (":", "=", "->"),
)
TEMPLATE_ANSWERS = ("correct", "wrong_a", "wrong_b")
END_TOKEN = "<eos>"
_K = len(TEMPLATE_SYNONYMS)
_TT_SUPPORT = tuple(
    (*words, answer, END_TOKEN)
    for words in itertools.product(*TEMPLATE_SYNONYMS)
    for answer in TEMPLATE_ANSWERS
)
_TT_CORRECT_A = (*(s[0] for s in TEMPLATE_SYNONYMS), "correct", END_TOKEN)
_TT_CORRECT_B = (*(s[1] for s in TEMPLATE_SYNONYMS), "correct", END_TOKEN)

TEMPLATE_TASK = Scenario(
    name="template_task",
    description=(
        f"{_K} template positions, each with 3 synonymous tokens (initial 0.7/0.2/0.1), then a deciding "
        "position {correct, wrong_a, wrong_b} (initial 0.3/0.35/0.35), then <eos>: 3^5·3 = 729 "
        "trajectories. context='position': a step's context is its position only, so every completion "
        "shares the template softmaxes, like an LM's weights. Reward 1 iff the deciding token is correct. "
        "Template choices are independent of the reward, so the exact policy gradient on template "
        "contexts is 0: any drift there is learning tax, measured exactly as the KL to the initial "
        "policy over the template contexts. The equivalent set is every correct completion (first two: "
        "all-first-synonym vs all-second-synonym)."
    ),
    reference="DFPO App. E and App. G (learning tax on template tokens), eq. (3)",
    support=_TT_SUPPORT,
    rewards=tuple(1.0 if tau[_K] == "correct" else 0.0 for tau in _TT_SUPPORT),
    context="position",
    initial=_frozen(
        {
            **{t: dict(zip(TEMPLATE_SYNONYMS[t], (0.7, 0.2, 0.1), strict=True)) for t in range(_K)},
            _K: dict(zip(TEMPLATE_ANSWERS, (0.3, 0.35, 0.35), strict=True)),
        }
    ),
    equivalent=(
        _TT_CORRECT_A,
        _TT_CORRECT_B,
        *(tau for tau in _TT_SUPPORT if tau[_K] == "correct" and tau not in (_TT_CORRECT_A, _TT_CORRECT_B)),
    ),
    template_contexts=tuple(range(_K)),
)


SCENARIOS: dict[str, Scenario] = {
    s.name: s for s in (SHARED_PREFIX, EQUIVALENT_SOLUTIONS, CLIP_ASYMMETRY, TEMPLATE_TASK)
}


def get_scenario(name: str | Scenario) -> Scenario:
    """Look a scenario up by name (a ``Scenario`` is returned as is); unknown names list the valid ones."""
    if isinstance(name, Scenario):
        return name
    try:
        return SCENARIOS[name]
    except KeyError:
        raise ValueError(f"unknown scenario {name!r}; valid: {', '.join(SCENARIOS)}") from None


__all__ = [
    "CLIP_ASYMMETRY",
    "EQUIVALENT_SOLUTIONS",
    "SCENARIOS",
    "SHARED_PREFIX",
    "TEMPLATE_TASK",
    "Scenario",
    "clip_asymmetry_net",
    "clip_asymmetry_policies",
    "get_scenario",
    "shared_prefix_net",
    "shared_prefix_policies",
]
