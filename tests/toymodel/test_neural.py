"""NeuralPolicy: exact probabilities, a plain-loop forward pass, the shared unembedding, the proxy kernel.

Independent references: a per-trajectory, per-step Python loop that rebuilds e_c → h_c → logits over the
context's valid tokens → log-softmax with ``math``; per-token autograd gradients w.r.t. W_out alone; the
closed form (e_y − π)hᵀ of the output layer's gradient (eq. 6 of arXiv 2605.08666).
"""

from __future__ import annotations

import math

import pytest
import torch

from cancellation.coupling import coupling_kernel, output_overlap, per_token_scores, proxy_kernel
from toymodel.neural import NeuralPolicy
from toymodel.scenarios import SCENARIOS, get_scenario

#: Every comparison here is between two float64 computations of the same number, at a tolerance well above
#: float64's rounding (the neural policy vs plain loops, autograd and the exact kernels):
#: ``tests/exactness.py``.
pytestmark = pytest.mark.exactness


def loop_logp(pol: NeuralPolicy, params: list[torch.Tensor]) -> list[list[float]]:
    """log π(y_t|c_t) of every step of every trajectory, by a plain loop (Python floats)."""
    embed, w1, b1, w_out = (p.detach() for p in params[:4])
    b_out = params[4].detach() if pol.out_bias else None
    st = pol.structure
    out = []
    for tau in st.trajectories:
        row = []
        for t, tok in enumerate(tau):
            key = tau[:t] if st.context_mode == "prefix" else t
            c = st.context_id(key)
            h = [
                math.tanh(
                    sum(float(w1[i, a]) * float(embed[c, a]) for a in range(pol.d_embed)) + float(b1[i])
                )
                for i in range(pol.d_hidden)
            ]
            logits = {}
            for a in st.actions[c]:
                v = pol.vocab.index(a)
                z = sum(float(w_out[v, i]) * h[i] for i in range(pol.d_hidden))
                logits[a] = z + (float(b_out[v]) if b_out is not None else 0.0)
            m = max(logits.values())
            lse = m + math.log(sum(math.exp(z - m) for z in logits.values()))
            row.append(logits[tok] - lse)
        out.append(row)
    return out


@pytest.mark.parametrize("name", list(SCENARIOS))
@pytest.mark.parametrize("context", ["prefix", None])
def test_trajectory_probabilities_sum_to_one(name: str, context: str | None) -> None:
    pol = NeuralPolicy.from_scenario(name, context=context)
    params = pol.init_params(seed=3, scale=2.0)
    p = pol.probs(params).detach()
    assert p.shape == (pol.N,)
    assert bool((p > 0).all())
    assert abs(float(p.sum()) - 1.0) < 1e-12
    # exact expected reward = Σ_τ π(τ) R(τ), by a loop over the support
    ref = sum(float(pi) * r for pi, r in zip(p.tolist(), get_scenario(name).rewards, strict=True))
    assert abs(pol.expected_reward(params) - ref) < 1e-12


@pytest.mark.parametrize(
    ("name", "out_bias"),
    [("shared_prefix", False), ("equivalent_solutions", True), ("clip_asymmetry", False)],
)
def test_token_logp_equals_plain_loop(name: str, out_bias: bool) -> None:
    pol = NeuralPolicy.from_scenario(name, out_bias=out_bias)
    params = pol.init_params(seed=1, scale=1.5)
    if out_bias:
        with torch.no_grad():
            params[4].copy_(torch.linspace(-1.0, 1.0, pol.V, dtype=torch.float64))
    ref = loop_logp(pol, params)
    got = pol.token_logp(params).detach()
    for i, row in enumerate(ref):
        for t, v in enumerate(row):
            assert abs(float(got[i, t]) - v) < 1e-12
        for t in range(len(row), pol.T):  # padding
            assert float(got[i, t]) == 0.0
    # a subset of trajectories in any order, and the probabilities of the taken tokens
    idx = torch.tensor([pol.N - 1, 0, pol.N // 2])
    sub = pol.token_logp(params, idx).detach()
    probs = pol.token_probs(params, idx).detach()
    tok = pol.token_ids(idx)
    for b, i in enumerate(idx.tolist()):
        for t, v in enumerate(ref[i]):
            assert abs(float(sub[b, t]) - v) < 1e-12
            assert abs(float(probs[b, t, tok[b, t]]) - math.exp(v)) < 1e-12
            assert abs(float(probs[b, t].sum()) - 1.0) < 1e-12
        for t in range(len(ref[i]), pol.T):
            assert int(tok[b, t]) == -1
            assert float(probs[b, t].abs().sum()) == 0.0


def test_token_probs_zero_outside_valid_set_and_hidden_is_tanh_layer() -> None:
    pol = NeuralPolicy.from_scenario("template_task")
    params = pol.init_params(seed=0)
    idx = torch.arange(0, pol.N, 97)
    probs = pol.token_probs(params, idx).detach()
    ctx = pol.ctx[idx]
    assert bool((probs[~pol.valid_vocab[ctx]] == 0).all())
    h = pol.hidden(params, idx)
    embed, w1, b1 = params[0], params[1], params[2]
    for b in range(idx.numel()):
        for t in range(pol.T):
            ref = torch.tanh(w1 @ embed[ctx[b, t]] + b1)
            assert torch.allclose(h[b, t], ref, atol=1e-14, rtol=0)


def test_same_token_string_in_two_contexts_shares_its_unembedding_row() -> None:
    pol = NeuralPolicy.from_scenario("shared_prefix")  # "is" follows both "answer" and "result"
    st = pol.structure
    c_a, c_r = st.context_id(("answer",)), st.context_id(("result",))
    assert c_a != c_r
    v = pol.vocab.index("is")
    assert bool(pol.valid_vocab[c_a, v]) and bool(pol.valid_vocab[c_r, v])
    assert pol.vocab.count("is") == 1
    i_a = st.trajectory_index(("answer", "is", "20"))
    i_r = st.trajectory_index(("result", "is", "20"))
    tok = pol.token_ids(torch.tensor([i_a, i_r]))
    assert int(tok[0, 1]) == int(tok[1, 1]) == v
    params = pol.init_params(seed=2)
    hid = pol.hidden_table(params).detach()
    z = pol.logits_table(params).detach()
    for c in (c_a, c_r):  # z_c[is] = W_out[is] · h_c in both contexts
        assert abs(float(z[c, v]) - float(params[3][v].detach() @ hid[c])) < 1e-14
    # moving the row of "is" moves its logit in both contexts; moving another row does not
    bumped = [p.detach().clone() for p in params]
    bumped[3][v] += 0.5
    z2 = pol.logits_table(bumped)
    assert float(z2[c_a, v] - z[c_a, v]) != 0.0 and float(z2[c_r, v] - z[c_r, v]) != 0.0
    other = [p.detach().clone() for p in params]
    other[3][pol.vocab.index("25")] += 0.5
    z3 = pol.logits_table(other)
    assert float(z3[c_a, v]) == float(z[c_a, v]) and float(z3[c_r, v]) == float(z[c_r, v])


def _batch(pol: NeuralPolicy, params: list[torch.Tensor], n: int, seed: int):
    idx = pol.sample(n, params, torch.Generator().manual_seed(seed))
    valid = pol.step_mask(idx).bool()

    def logp() -> torch.Tensor:
        return pol.token_logp(params, idx)[valid]

    with torch.no_grad():
        hidden = pol.hidden(params, idx)[valid]
        probs = pol.token_probs(params, idx)[valid]
    return logp, hidden, probs, pol.token_ids(idx)[valid], pol.ctx[idx][valid]


@pytest.mark.parametrize(("name", "context"), [("shared_prefix", "prefix"), ("template_task", "prefix")])
def test_proxy_kernel_is_the_exact_kernel_of_the_unembedding(name: str, context: str) -> None:
    pol = NeuralPolicy.from_scenario(name, context=context)
    params = pol.init_params(seed=5, scale=1.5)
    logp, hidden, probs, tokens, _ = _batch(pol, params, 12, seed=0)
    k_head = coupling_kernel(per_token_scores(logp, [params[3]]))
    k_proxy = proxy_kernel(hidden, probs, tokens)
    assert torch.allclose(k_proxy, k_head, atol=1e-9, rtol=0)
    # shared W1, b1 and e couple tokens beyond the output layer: the full kernel is not the proxy
    k_full = coupling_kernel(per_token_scores(logp, params))
    assert float(torch.linalg.norm(k_full - k_proxy)) > 1e-2 * float(torch.linalg.norm(k_full))
    # and K_full − K_head is the kernel of the other parameters (a Gram matrix: PSD)
    rest = k_full - k_head
    assert float(torch.linalg.eigvalsh(rest).min()) > -1e-9 * float(rest.abs().max())


def test_full_kernel_couples_tokens_the_proxy_cannot() -> None:
    # position contexts: tokens at different positions have disjoint valid sets, so D_jk = 0 exactly
    pol = NeuralPolicy.from_scenario("template_task", context="position")
    params = pol.init_params(seed=0)
    logp, hidden, probs, tokens, ctx = _batch(pol, params, 4, seed=1)
    k_proxy = proxy_kernel(hidden, probs, tokens)
    k_full = coupling_kernel(per_token_scores(logp, params))
    apart = ctx[:, None] != ctx[None, :]
    assert bool((k_proxy[apart] == 0).all())
    movable = probs.max(-1).values < 1.0  # the <eos> step has π = 1: its score is 0
    both = apart & movable[:, None] & movable[None, :]
    assert float(k_full[both].abs().min()) > 0.0


def test_output_bias_adds_the_distributional_factor() -> None:
    pol = NeuralPolicy.from_scenario("shared_prefix", out_bias=True)
    params = pol.init_params(seed=4, scale=1.5)
    logp, hidden, probs, tokens, _ = _batch(pol, params, 10, seed=2)
    k_head = coupling_kernel(per_token_scores(logp, params[pol.head_slice]))
    # eq. (7) with h extended by a constant 1: K = (⟨h_j, h_k⟩ + 1)·D_jk
    ref = proxy_kernel(hidden, probs, tokens) + output_overlap(probs, tokens)
    assert torch.allclose(k_head, ref, atol=1e-9, rtol=0)


def test_output_gradient_closed_form() -> None:
    # eq. (6): ∇_{W_out} log π(y|c) = (e_y − π_c) h_cᵀ (restricted to the valid tokens)
    pol = NeuralPolicy.from_scenario("equivalent_solutions")
    params = pol.init_params(seed=7, scale=2.0)
    i = 1
    t = 3  # "25" / "20" after "The answer is"
    lp = pol.token_logp(params, torch.tensor([i]))[0, t]
    (g,) = torch.autograd.grad(lp, [params[3]])
    c = int(pol.ctx[i, t])
    y = int(pol.token_ids(torch.tensor([i]))[0, t])
    pi = pol.probs_table(params)[c].detach()
    e = torch.zeros(pol.V, dtype=torch.float64)
    e[y] = 1.0
    ref = torch.outer(e - pi, pol.hidden_table(params)[c].detach())
    assert torch.allclose(g, ref, atol=1e-14, rtol=0)


def test_sampling_is_seeded_and_follows_the_exact_distribution() -> None:
    pol = NeuralPolicy.from_scenario("shared_prefix")
    params = pol.init_params(seed=0, scale=2.0)
    a = pol.sample(50, params, torch.Generator().manual_seed(9))
    b = pol.sample(50, params, torch.Generator().manual_seed(9))
    assert torch.equal(a, b)
    n = 40_000
    draws = pol.sample(n, params, torch.Generator().manual_seed(0))
    freq = torch.bincount(draws, minlength=pol.N).double() / n
    p = pol.probs(params).detach()
    sd = (p * (1 - p) / n).sqrt()
    assert bool(((freq - p).abs() <= 5 * sd + 1e-12).all())


def test_init_is_seeded_leaves() -> None:
    pol = NeuralPolicy.from_scenario("template_task", context="position")
    a, b, c = pol.init_params(0), pol.init_params(0), pol.init_params(1)
    assert all(p.is_leaf and p.requires_grad and p.dtype == torch.float64 for p in a)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a[0], c[0])
    assert pol.num_params() == sum(p.numel() for p in a)
    assert pol.num_params() < 500  # 7 contexts: a few hundred weights


def test_fit_to_scenario_target() -> None:
    pol = NeuralPolicy.from_scenario("template_task", context="position")
    target = pol.scenario_target()
    tab = get_scenario("template_task")
    # the target is the scenario's initial distribution: 0.7 / 0.2 / 0.1 on the first template position
    for tok, p in tab.initial[0].items():
        assert abs(float(target[0, pol.vocab.index(tok)]) - p) < 1e-12
    params = pol.init_params(0)
    before = [p.detach().clone() for p in params]
    fitted, kl = pol.fit(params, target, steps=200, lr=0.1)
    assert kl < 1e-4
    assert float((pol.probs_table(fitted).detach() - target).abs().max()) < 1e-2
    assert all(torch.equal(p, q) for p, q in zip(params, before, strict=True))  # the input is untouched
    assert not torch.equal(fitted[0], params[0])


def test_bad_params_raise() -> None:
    pol = NeuralPolicy.from_scenario("shared_prefix")
    params = pol.init_params(0)
    with pytest.raises(ValueError, match="W_out"):
        pol.token_logp([*params[:3], params[3][:-1]])
    with pytest.raises(ValueError, match="tensors"):
        pol.token_logp(params[:3])
    with pytest.raises(ValueError, match="context mode"):
        NeuralPolicy.from_scenario("shared_prefix", context="lattice")
