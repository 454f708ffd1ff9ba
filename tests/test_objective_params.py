"""Each objective's parameters are declared once (``cancellation.params``) and every consumer reads them there.

For every registered objective with a parameter dataclass, its defaults are what the loss uses when a parameter
is left out (loss and gradient, float64), what ``RunConfig`` runs with, the toy theory's defaults, what the toy
CLI runs with and what the TRL plug-in reports; each field is wired (another value changes the loss or its
gradient); and an out-of-range value is refused with the one message of the dataclass everywhere.
"""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pytest
import torch

from cancellation.objectives import (
    OBJECTIVES,
    PARAMS,
    compute_loss,
    default_params,
    dfpo_weights,
    params_class,
)
from cancellation.params import ESTIMATORS, ObjectiveParams
from scaledrun.config import OBJECTIVE_FIELDS, ObjectiveConfig, load_config, objective_takes
from toymodel import __main__ as cli
from toymodel import theory

F64 = torch.float64
#: every registered objective with a parameter class (the registry, as imported: the shipped ones and any a
#: module registers on import)
WITH_PARAMS = tuple(PARAMS)
#: those the toy theory has closed forms for
WITH_CLOSED_FORM = tuple(n for n in WITH_PARAMS if n in theory._DEFAULTS)


def _alternative(f: dataclasses.Field) -> object:
    """A valid value other than the field's default."""
    if isinstance(f.default, bool):
        return not f.default
    if isinstance(f.default, float):
        return round(f.default + 0.3, 6)  # in range for every clip ε (ε_low ≤ 0.2 + 0.3 < 1)
    choices = f.metadata["choices"]
    valid = choices() if callable(choices) else choices
    return next(v for v in valid if v != f.default)


def _batch(seed: int = 3):
    """Two groups of 4 completions, unequal lengths, token ratios exp(N(0, 0.3²)): many clip, on both sides."""
    gen = torch.Generator().manual_seed(seed)
    b, t = 8, 5
    old = -torch.rand(b, t, generator=gen, dtype=F64) - 0.5
    logp = (old + 0.3 * torch.randn(b, t, generator=gen, dtype=F64)).requires_grad_(True)
    lengths = torch.tensor([5, 3, 4, 5, 2, 5, 4, 3])
    mask = (torch.arange(t)[None, :] < lengths[:, None]).to(F64)
    group = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    adv = torch.tensor([1.0, -0.5, -1.5, 1.0, 0.7, -0.2, 0.9, -1.4], dtype=F64)
    return logp, old, adv, mask, group


def _loss_and_grad(name: str, **params) -> tuple[float, torch.Tensor, dict[str, float]]:
    """The loss, its gradient in logp and the metrics (clip fractions, ratios, weights)."""
    logp, old, adv, mask, group = _batch()
    loss, metrics = compute_loss(name, logp, old, adv, mask, group, **params)
    (grad,) = torch.autograd.grad(loss, logp)
    return float(loss.detach()), grad, metrics


def _largest_change(a, b) -> float:
    """The largest absolute difference between two ``_loss_and_grad`` results."""
    return max(abs(a[0] - b[0]), float((a[1] - b[1]).abs().max()), *(abs(a[2][k] - b[2][k]) for k in a[2]))


def test_every_registered_objective_declares_its_parameters_with_one_line_of_doc_each():
    # the objectives this project ships all declare theirs
    assert {"grpo", "grpo_symclip", "gspo", "dfpo"} <= set(WITH_PARAMS) <= set(OBJECTIVES)
    assert set(theory._DEFAULTS) <= set(WITH_PARAMS)
    for name in WITH_PARAMS:
        cls = params_class(name)
        assert cls is PARAMS[name] and issubclass(cls, ObjectiveParams) and cls.objective == name
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen
        for f in dataclasses.fields(cls):
            doc = f.metadata["doc"]
            assert doc.strip() and "\n" not in doc, (name, f.name)
            assert type(f.default) in (float, bool, str), (name, f.name)


def test_defaults_are_the_papers():
    """GRPO's ε = 0.2 (PPO's clip), GSPO's 3e-4 / 4e-4 (its paper's setting, which DFPO's App. I uses),
    GRPO-fix's ε = 0.2 (DFPO App. H, GRPO's clip); gspo's own estimator is its clipped surrogate, dfpo's the
    paper's stop-gradient estimator with Min-Replace."""
    assert default_params("grpo") == {"epsilon_low": 0.2, "epsilon_high": 0.2}
    assert default_params("grpo_symclip") == {"epsilon": 0.2}
    assert default_params("gspo") == {
        "epsilon_low": 3e-4, "epsilon_high": 4e-4, "length_norm": True, "estimator": "ppo_clip",
    }  # fmt: skip
    assert default_params("dfpo") == {
        "epsilon_low": 3e-4, "epsilon_high": 4e-4, "length_norm": True, "transform": "min_replace",
        "estimator": "paper", "stop_grad": True,
    }  # fmt: skip


@pytest.mark.parametrize("name", WITH_PARAMS)
def test_the_loss_uses_the_dataclass_defaults_when_a_parameter_is_left_out(name):
    """Loss, gradient and metrics with every parameter omitted == with the dataclass's defaults passed
    explicitly (float64, the same operations: equal to the bit), and each field is wired: another valid value
    changes the loss, its gradient or the metrics on this batch (so the first comparison could fail)."""
    defaults = default_params(name)
    omitted, given = _loss_and_grad(name), _loss_and_grad(name, **defaults)
    assert omitted[0] == given[0] and torch.equal(omitted[1], given[1]) and omitted[2] == given[2]
    for f in dataclasses.fields(params_class(name)):
        alt = _alternative(f)
        # measured (this batch): the smallest change over all fields is 5.3e-2 (dfpo's estimator and stop_grad,
        # in the gradient); the values compared are ≤ 1.4, so float64 rounding (~1e-15) is far below 1e-6
        assert _largest_change(omitted, _loss_and_grad(name, **{**defaults, f.name: alt})) > 1e-6, (
            name,
            f.name,
        )


@pytest.mark.parametrize("fn", [dfpo_weights, theory.dfpo_shared_prefix_coefficient])
def test_dfpo_helpers_default_to_dfpos_parameters(fn):
    """``dfpo_weights`` and the toy theory's DFPO coefficient take DFPO's parameters as keywords: their defaults
    are the dataclass's (``transform`` is a required argument of the theory's)."""
    sig = inspect.signature(fn).parameters
    shared = [k for k in default_params("dfpo") if k in sig and sig[k].default is not inspect.Parameter.empty]
    assert len(shared) >= 3
    for key in shared:
        assert sig[key].default == default_params("dfpo")[key], key


@pytest.mark.parametrize("name", WITH_PARAMS)
def test_runconfig_runs_the_dataclass_defaults(name):
    """``RunConfig`` (from the shipped YAML, as ``scaledrun.train`` loads it) takes exactly the dataclass's
    fields, runs its defaults when none is set, and passes a set one to the loss unchanged."""
    cfg = load_config("scaledrun/configs/default.yaml", ["--objective", name])
    assert objective_takes(name) == tuple(default_params(name))
    assert dataclasses.asdict(cfg.objective_param_values()) == default_params(name)
    # what the trainer passes to the loss gives the loss of the defaults
    assert _loss_and_grad(name, **cfg.objective_params())[0] == _loss_and_grad(name)[0]
    for f in dataclasses.fields(params_class(name)):
        alt = _alternative(f)
        cfg = load_config(None, ["--objective", name, f"--{f.name}", str(alt)])
        values = dataclasses.asdict(cfg.objective_param_values())
        assert values == {**default_params(name), f.name: alt}
        assert cfg.objective_params()[f.name] == alt


def test_runconfig_has_one_field_per_parameter_and_its_unset_value_is_every_default():
    fields = {f.name: f for f in dataclasses.fields(ObjectiveConfig)}
    every = {f.name for cls in PARAMS.values() for f in dataclasses.fields(cls)}
    assert set(OBJECTIVE_FIELDS) == every
    for name, unset in OBJECTIVE_FIELDS.items():
        assert fields[name].default == unset
        if unset is not None:  # a bool: every objective that takes it defaults to it
            assert {default_params(o)[name] for o in PARAMS if name in default_params(o)} == {unset}


@pytest.mark.parametrize("name", WITH_CLOSED_FORM)
def test_toy_theory_defaults_are_the_dataclass_defaults(name):
    assert theory._DEFAULTS[name] == default_params(name)
    assert theory._params(name, {}) == default_params(name)
    # the closed form with the parameters omitted == with the defaults given
    args = (1.3, 0.8, 0.2, 0.6)
    assert theory.shared_prefix_closed_form(name, *args) == theory.shared_prefix_closed_form(
        name, *args, **default_params(name)
    )
    # the closed forms' own aggregation is the loss's (its signature's default)
    loss_default = inspect.signature(OBJECTIVES[name]).parameters["aggregation"].default
    assert theory._DEFAULT_AGGREGATION[name] == loss_default
    theory._params(name, {"aggregation": loss_default})  # accepted
    other = next(a for a in ("token-mean", "seq-mean-token-mean") if a != loss_default)
    with pytest.raises(ValueError, match=f"own aggregation '{loss_default}'"):
        theory._params(name, {"aggregation": other})


#: the toy theory's clip helpers: the objective whose parameters each takes, and its keyword for each field
THEORY_CLIP_HELPERS = [
    (theory.clip_surrogate, "grpo", {"epsilon_low": "epsilon_low", "epsilon_high": "epsilon_high"}),
    (theory.clip_coefficient, "grpo", {"epsilon_low": "epsilon_low", "epsilon_high": "epsilon_high"}),
    (theory.symclip_coefficient, "grpo_symclip", {"epsilon": "epsilon"}),
]


@pytest.mark.parametrize(("fn", "name", "keywords"), THEORY_CLIP_HELPERS)
def test_toy_theory_clip_helpers_default_to_and_check_with_the_dataclass(fn, name, keywords):
    """The App. F/H helpers' ε defaults are the objective's, and an out-of-range ε is refused with the
    dataclass's message (grpo's ε_low = 1.5 used to give 0.0 here while the loss refused it)."""
    sig = inspect.signature(fn).parameters
    for field, keyword in keywords.items():
        assert sig[keyword].default == default_params(name)[field], keyword
    args = (1.5,) if name == "grpo" else (1.5, [-1.0, 1.0])
    for bad_name, field, value, why in BAD:
        if bad_name != name or field not in keywords or not isinstance(value, float):
            continue
        with pytest.raises(ValueError) as err:
            fn(*args, **{keywords[field]: value})
        assert str(err.value) == str(_refusal(name, field, value)) and why in str(err.value)
    # the same ε given explicitly as the default: the same value
    assert fn(*args) == fn(*args, **{k: default_params(name)[f] for f, k in keywords.items()})


def _refusal(name: str, field: str, value: object) -> ValueError:
    with pytest.raises(ValueError) as err:
        params_class(name)(**{field: value})
    return err.value


@pytest.mark.parametrize("name", WITH_PARAMS)
def test_toy_cli_parses_every_parameter_and_runs_the_defaults(name):
    parser = cli.build_parser()
    args = parser.parse_args(["template_task", "--objective", name])
    given = cli._objective_params(args)
    assert given == {}  # nothing given: the loss's own defaults
    assert dataclasses.asdict(params_class(name)(**given)) == default_params(name)
    for f in dataclasses.fields(params_class(name)):
        alt = _alternative(f)
        option = f"--{f.name.replace('_', '-')}"
        argv = (
            [option if alt is True else f"--no-{option[2:]}"] if isinstance(alt, bool) else [option, str(alt)]
        )
        parsed = cli._objective_params(parser.parse_args(["template_task", "--objective", name, *argv]))
        assert parsed == {f.name: alt} and type(parsed[f.name]) is type(alt)
    # the help shows each objective's default, read from the dataclass
    help_text = " ".join(parser.format_help().split())
    for key, value in default_params(name).items():
        assert f"{name} {value}" in help_text, (name, key)


@pytest.mark.parametrize("name", WITH_PARAMS)
def test_trl_plugin_resolves_the_dataclass_defaults(name, tmp_path):
    trl_plugin = pytest.importorskip("scaledrun.trl_plugin")
    args = trl_plugin.CancellationGRPOConfig(
        output_dir=str(tmp_path), use_cpu=True, bf16=False, per_device_train_batch_size=8, num_generations=4,
        objective=name,
    )  # fmt: skip
    d = default_params(name)
    assert dataclasses.asdict(args.objective_param_values()) == d
    expected = (d["epsilon"], d["epsilon"]) if "epsilon" in d else (d["epsilon_low"], d["epsilon_high"])
    assert trl_plugin.resolved_eps(args) == expected
    if name in trl_plugin.TRL_LOSS_TYPE:
        settings = trl_plugin.trl_loss_settings(args)
        assert (settings["epsilon"], settings["epsilon_high"]) == expected


#: out-of-range values, with the one message of the dataclass's check
BAD = [
    ("grpo", "epsilon_low", 1.5, "must be in [0, 1)"),
    ("grpo", "epsilon_high", -0.2, "must be ≥ 0"),
    ("gspo", "epsilon_low", -0.1, "must be in [0, 1)"),
    ("dfpo", "epsilon_high", -0.5, "must be ≥ 0"),
    ("grpo_symclip", "epsilon", -0.1, "must be ≥ 0"),
    ("dfpo", "transform", "orth", "unknown value; valid: min_replace, orth_proj"),
    ("gspo", "estimator", "clip", f"unknown value; valid: {', '.join(ESTIMATORS)}"),
]


@pytest.mark.parametrize(("name", "field", "value", "why"), BAD)
def test_an_out_of_range_value_is_refused_with_one_message_everywhere(
    name, field, value, why, tmp_path, capsys
):
    with pytest.raises(ValueError) as err:
        params_class(name)(**{field: value})
    message = str(err.value)
    # the message names the objective and the field, written out independently here
    assert message.startswith(f"objective {name!r} parameter `{field}`={value!r}: {why}")
    logp, old, adv, mask, group = _batch()
    with pytest.raises(ValueError) as err:
        compute_loss(name, logp, old, adv, mask, group, **{field: value})
    assert str(err.value) == message
    with pytest.raises(ValueError) as err:
        load_config(None, ["--objective", name, f"--{field}", str(value)])
    assert str(err.value) == message
    with pytest.raises(ValueError) as err:
        theory._params(name, {field: value})
    assert str(err.value) == message
    option = f"--{field.replace('_', '-')}"
    if field != "estimator":  # argparse's own choices refuse an unknown estimator before any run
        with pytest.raises(SystemExit):
            cli.main(["template_task", "--objective", name, option, str(value), "--steps", "1"])
        assert f"error: {message}" in capsys.readouterr().err
    trl_plugin = pytest.importorskip("scaledrun.trl_plugin")
    with pytest.raises(ValueError) as err:
        trl_plugin.CancellationGRPOConfig(
            output_dir=str(tmp_path), use_cpu=True, bf16=False, per_device_train_batch_size=8, num_generations=4,
            objective=name, **{field: value},
        )  # fmt: skip
    assert str(err.value) == message


def test_the_about_page_shows_each_objectives_dataclass_defaults():
    """The About page's objectives table (app/views/about.py) shows each objective's defaults as declared:
    every ``field=default`` of its dataclass and the loss's own aggregation (it used to type them by hand)."""
    from streamlit.testing.v1 import AppTest

    page = Path(__file__).resolve().parents[1] / "app/views/about.py"
    at = AppTest.from_file(str(page), default_timeout=60)
    at.run()
    assert not at.exception
    (table,) = [t for t in at.table if "objective" in t.value.columns]
    shown = dict(zip(table.value["objective"], table.value["defaults"], strict=True))
    for name in WITH_PARAMS:
        parts = shown[name].split(", ")
        want = [f"{k}={v}" for k, v in default_params(name).items()]
        aggregation = inspect.signature(OBJECTIVES[name]).parameters["aggregation"].default
        assert parts == [*want, f"aggregation={aggregation}"], name
