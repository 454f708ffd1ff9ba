"""RunConfig: YAML + command line through HfArgumentParser, validation naming the field, presets, round trip."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from cancellation.objectives import objective_names
from cancellation.transforms import TRANSFORMS
from scaledrun.config import PRESETS, RunConfig, field_docs, load_config, save_config
from scaledrun.rewards import reward_names

DEFAULT_YAML = Path(__file__).resolve().parents[2] / "scaledrun" / "configs" / "default.yaml"


def test_default_yaml_maps_one_to_one_to_the_dataclass():
    import yaml

    keys = list(yaml.safe_load(DEFAULT_YAML.read_text()))
    assert keys == [f.name for f in dataclasses.fields(RunConfig)]
    # the file is the dataclass's defaults: num_train null is every row of a dataset (a starting point
    # for any dataset, however few rows it has) and SYNTHETIC_DEFAULT_N problems of the tiny run's task
    assert load_config(str(DEFAULT_YAML), []) == RunConfig()
    assert RunConfig().num_train is None


def test_every_field_has_a_docstring():
    docs = field_docs()
    assert set(docs) == {f.name for f in dataclasses.fields(RunConfig)}
    assert all(len(d) > 10 for d in docs.values())


def test_overrides_win_over_yaml_and_yaml_over_defaults(tmp_path):
    path = tmp_path / "run.yaml"
    # pyyaml reads 8e-7 (no dot) as a string: it must still load as the float
    path.write_text("objective: gspo\nlr: 8e-7\ngroup_size: 4\nar_alpha: 0.2\n")
    cfg = load_config(str(path), ["--objective", "dfpo", "--transform", "orth_proj", "--ar_alpha", "none"])
    assert (cfg.objective, cfg.transform, cfg.group_size, cfg.ar_alpha) == ("dfpo", "orth_proj", 4, None)
    assert cfg.lr == 8e-7 and isinstance(cfg.lr, float)
    assert cfg.objective_params() == {"length_norm": True, "transform": "orth_proj", "stop_grad": True}
    cfg = load_config(None, ["--objective", "grpo", "--epsilon_high", "0.28", "--beta", "0.01"])
    assert cfg.objective_params() == {"epsilon_high": 0.28, "beta": 0.01}
    cfg = load_config(None, ["--truncation", "keep", "--lora_target_modules", "q_proj", "v_proj"])
    assert cfg.truncation == "keep" and cfg.lora_target_modules == ["q_proj", "v_proj"]


def test_estimator_and_truncation_fields(tmp_path):
    assert (RunConfig().truncation, RunConfig().estimator) == ("mask", None)
    cfg = load_config(None, ["--objective", "gspo", "--estimator", "paper"])
    assert cfg.objective_params() == {"length_norm": True, "estimator": "paper"}
    cfg = load_config(None, ["--objective", "dfpo", "--estimator", "ppo_clip", "--transform", "orth_proj"])
    assert cfg.objective_params()["estimator"] == "ppo_clip"
    assert load_config(None, ["--truncation", "failure_reward"]).truncation == "failure_reward"
    # the removed `mask_truncated` names its replacement, from a YAML file and from the command line
    path = tmp_path / "old.yaml"
    path.write_text("mask_truncated: true\n")
    for load in (
        lambda: load_config(str(path), []),
        lambda: load_config(None, ["--mask_truncated", "true"]),
        lambda: load_config(None, ["--no_mask_truncated"]),
    ):
        with pytest.raises(ValueError, match="`truncation`"):
            load()


def test_presets_layer_under_yaml_and_cli(tmp_path):
    cfg = load_config(None, ["--preset", "dfpo_paper"])
    # DFPO paper App. I
    assert (cfg.lr, cfg.min_lr_ratio, cfg.warmup_ratio, cfg.group_size) == (8e-7, 0.2, 0.03, 32)
    assert cfg.objective == "dfpo" and cfg.model == "Qwen/Qwen3-32B"
    path = tmp_path / "p.yaml"
    path.write_text("preset: qwen3-0.6b\nlr: 3.0e-6\n")
    cfg = load_config(str(path), [])
    assert (cfg.model, cfg.lr, cfg.dtype) == ("Qwen/Qwen3-0.6B", 3e-6, "bfloat16")
    assert any("Qwen2.5" in p.get("model", "") for p in PRESETS.values())
    for name in PRESETS:  # every preset is a valid config
        assert load_config(None, ["--preset", name]).preset == name


def test_cli_preset_wins_over_a_yaml_listing_every_field(tmp_path):
    # default.yaml lists lr and model; a preset named on the command line must still take effect
    cfg = load_config(str(DEFAULT_YAML), ["--preset", "qwen3-0.6b"])
    assert (cfg.model, cfg.lr, cfg.dtype, cfg.lora_rank) == ("Qwen/Qwen3-0.6B", 1e-5, "bfloat16", 16)
    assert cfg.preset == "qwen3-0.6b"
    # fields the preset leaves alone keep the file's values (a copy with two values off the defaults)
    listed = tmp_path / "listed.yaml"
    text = (
        DEFAULT_YAML.read_text().replace("num_train: null", "num_train: 64").replace("steps: 200", "steps: 7")
    )
    listed.write_text(text)
    cfg = load_config(str(listed), ["--preset", "qwen3-0.6b"])
    assert (cfg.model, cfg.steps, cfg.num_train) == ("Qwen/Qwen3-0.6B", 7, 64)
    # the other command-line options still override the preset, wherever they stand
    cfg = load_config(str(DEFAULT_YAML), ["--lr", "3e-6", "--preset", "qwen3-0.6b"])
    assert (cfg.model, cfg.lr) == ("Qwen/Qwen3-0.6B", 3e-6)
    # a command-line preset replaces a preset named in the file; --preset none drops it
    cfg = load_config(str(DEFAULT_YAML), ["--preset", "dfpo_paper"])
    assert (cfg.model, cfg.lr, cfg.objective, cfg.group_size) == ("Qwen/Qwen3-32B", 8e-7, "dfpo", 32)


def test_cli_preset_over_a_file_with_another_preset(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("preset: qwen3-0.6b\nlr: 3.0e-6\ngroup_size: 4\n")
    cfg = load_config(str(path), ["--preset", "qwen3-1.7b"])
    assert (cfg.model, cfg.lr, cfg.group_size) == ("Qwen/Qwen3-1.7B", 5e-6, 4)
    cfg = load_config(str(path), ["--preset", "none"])
    assert (cfg.preset, cfg.model, cfg.lr, cfg.dtype) == (None, RunConfig().model, 3e-6, "float32")


def test_micro_batch_size_field():
    assert RunConfig().micro_batch_size == 0
    assert load_config(None, ["--micro_batch_size", "3"]).micro_batch_size == 3
    assert load_config(None, ["--micro_batch_size", "none"]).micro_batch_size is None
    with pytest.raises(ValueError, match="`micro_batch_size`"):
        load_config(None, ["--micro_batch_size=-1"])


def test_save_config_round_trips(tmp_path):
    cfg = load_config(None, ["--preset", "dfpo_paper", "--transform", "orth_proj_pos", "--grad_clip", "none"])
    path = save_config(cfg, tmp_path / "sub" / "config.yaml")
    assert load_config(str(path), []) == cfg
    assert cfg.grad_clip is None
    # a preset field overridden on the command line: the saved file (preset: dfpo_paper, lr: 1e-6) reads
    # back with the file's lr, since a preset named in a file sits under that file's keys
    cfg = load_config(str(DEFAULT_YAML), ["--preset", "dfpo_paper", "--lr", "1e-6"])
    path = save_config(cfg, tmp_path / "again" / "config.yaml")
    assert load_config(str(path), []) == cfg and cfg.lr == 1e-6


@pytest.mark.parametrize(
    ("args", "field", "lists"),
    [
        (["--objective", "ppo"], "objective", objective_names()),
        (["--objective", "dfpo", "--transform", "flip"], "transform", list(TRANSFORMS)),
        (["--aggregation", "sum"], "aggregation", ["token-mean", "seq-mean-token-mean"]),
        (["--reward", "bleu"], "reward", reward_names()),
        (["--task", "chess"], "task", ["arithmetic", "arithmetic_words", "template"]),
        (["--group_size", "1"], "group_size", []),
        (["--epsilon_low", "1.0"], "epsilon_low", []),
        (["--epsilon_low", "-0.1"], "epsilon_low", []),
        (["--temperature", "0"], "temperature", []),
        (["--top_p", "0"], "top_p", []),
        (["--top_p", "1.5"], "top_p", []),
        (["--lr", "0"], "lr", []),
        (["--lr=-1e-4"], "lr", []),
        (["--prompts_per_step", "2", "--num_minibatches", "3"], "num_minibatches", []),
        (["--objective", "dfpo", "--ar_alpha", "0.2"], "ar_alpha", []),
        (["--objective", "dfpo", "--lopti_eta", "0.4"], "lopti_eta", []),
        (["--objective", "grpo", "--transform", "orth_proj"], "transform", []),
        (["--objective", "dfpo", "--estimator", "exact"], "estimator", ["paper", "ppo_clip"]),
        (["--objective", "grpo", "--estimator", "paper"], "estimator", []),
        (["--objective", "dfpo", "--stop_grad", "false", "--estimator", "paper"], "estimator", []),
        (["--objective", "gspo", "--estimator", "paper", "--lopti_eta", "0.4"], "estimator", []),
        (["--truncation", "drop"], "truncation", ["mask", "failure_reward", "keep"]),
        (["--dtype", "float8"], "dtype", ["float32", "bfloat16", "float64"]),
        (["--preset", "qwen9"], "preset", list(PRESETS)),
        (["--reward", "exact_match,bleu"], "reward", reward_names()),
        (["--reward", "exact_match,math_verify", "--reward_weights", "1.0"], "reward_weights", []),
        (["--reward_weights", "1.0", "nan"], "reward_weights", []),
        (["--num_train", "0"], "num_train", []),
        (["--eval_fraction", "1.0"], "eval_fraction", []),
        (["--eval_split", "test"], "eval_split", []),  # synthetic tasks have their own held-out split
        (["--train_split", "dev"], "train_split", []),
        (["--dataset_config", "main"], "dataset_config", []),
        (["--max_prompt_length", "0"], "max_prompt_length", []),
        (["--chat_template_kwargs", '{"tokenize": true}'], "chat_template_kwargs", ["tokenize"]),
        (["--answer_field", "reward_model."], "answer_field", []),
        (["--task", "./no/such/folder"], "task", ["./no/such/folder"]),
    ],
)
def test_invalid_values_name_the_field(args, field, lists):
    with pytest.raises(ValueError, match=f"`{field}`") as info:
        load_config(None, args)
    for name in lists:
        assert name in str(info.value)


def test_random_batching_allows_more_minibatches_than_prompts():
    cfg = load_config(None, ["--batching", "random", "--prompts_per_step", "2", "--num_minibatches", "3"])
    assert cfg.num_minibatches == 3


def test_missing_task_file_names_the_path(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(ValueError, match="`task`") as info:
        load_config(None, ["--task", str(missing)])
    assert str(missing) in str(info.value)
    present = tmp_path / "data.jsonl"
    present.write_text('{"prompt": "1+1", "answer": "2"}\n')
    assert load_config(None, ["--task", str(present)]).task == str(present)


def test_unknown_yaml_key_and_bad_yaml_types(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("objective: grpo\nlearning_rate: 1e-4\n")
    with pytest.raises(ValueError, match="learning_rate"):
        load_config(str(path), [])
    path.write_text("group_size: eight\n")
    with pytest.raises(ValueError, match="`group_size`"):
        load_config(str(path), [])
    path.write_text("stop_grad: 3\n")
    with pytest.raises(ValueError, match="`stop_grad`"):
        load_config(str(path), [])


def test_unknown_and_malformed_cli_options_raise():
    with pytest.raises(ValueError, match="--bogus"):
        load_config(None, ["--bogus", "1"])
    with pytest.raises(ValueError, match="lr"):
        load_config(None, ["--lr", "abc"])


def test_direct_construction_validates():
    with pytest.raises(ValueError, match="`group_size`"):
        RunConfig(group_size=0)


def test_data_and_reward_fields_from_yaml_and_the_command_line(tmp_path):
    path = tmp_path / "data.yaml"
    path.write_text(
        "reward: [exact_match, math_verify]\nreward_weights: [1, 0.5]\n"
        "chat_template_kwargs: {enable_thinking: false}\nsystem_prompt: Be brief.\nnum_train: null\n"
    )
    cfg = load_config(str(path), [])
    assert (cfg.reward, cfg.reward_weights) == (
        "exact_match,math_verify",
        [1.0, 0.5],
    )  # a YAML list is joined
    assert all(isinstance(w, float) for w in cfg.reward_weights)
    assert (cfg.chat_template_kwargs, cfg.system_prompt, cfg.num_train) == (
        {"enable_thinking": False},
        "Be brief.",
        None,
    )
    assert load_config(str(save_config(cfg, tmp_path / "saved.yaml")), []) == cfg  # round trip
    cfg = load_config(
        str(path),
        [
            "--reward",
            "math_verify",
            "--reward_weights",
            "none",
            "--chat_template_kwargs",
            '{"enable_thinking": true}',
        ],
    )
    assert (cfg.reward, cfg.reward_weights, cfg.chat_template_kwargs) == (
        "math_verify",
        None,
        {"enable_thinking": True},
    )
    assert (
        load_config(None, ["--chat_template_kwargs", "null", "--num_train", "none"]).chat_template_kwargs
        is None
    )
    assert RunConfig(reward=["exact_match", "math_verify"], reward_weights=[2, 1]).reward_weights == [
        2.0,
        1.0,
    ]
    for bad in ("[1, 2]", "{not json"):
        with pytest.raises(ValueError, match="chat_template_kwargs") as info:
            load_config(None, ["--chat_template_kwargs", bad])
        assert "JSON object" in str(info.value)
    path.write_text("chat_template_kwargs: [enable_thinking]\n")
    with pytest.raises(ValueError, match="`chat_template_kwargs`"):
        load_config(str(path), [])


def test_dataset_fields(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "1+1", "answer": "2"}\n')
    test = tmp_path / "test.jsonl"
    test.write_text('{"prompt": "2+2", "answer": "4"}\n')
    cfg = load_config(None, ["--task", str(data), "--eval_split", str(test), "--max_prompt_length", "512"])
    assert (cfg.eval_split, cfg.max_prompt_length, cfg.train_split) == (str(test), 512, "train")
    assert load_config(None, ["--task", str(data), "--eval_fraction", "0.1"]).eval_fraction == 0.1
    # a hub name is taken as it is (no network at load time)
    cfg = load_config(None, ["--task", "openai/gsm8k", "--dataset_config", "main", "--eval_split", "test"])
    assert (cfg.task, cfg.dataset_config, cfg.eval_split) == ("openai/gsm8k", "main", "test")
    with pytest.raises(ValueError, match="`eval_fraction`"):
        load_config(None, ["--task", str(data), "--eval_split", str(test), "--eval_fraction", "0.1"])
    with pytest.raises(ValueError, match="`eval_split`") as info:
        load_config(None, ["--task", str(data), "--eval_split", "test"])
    assert "file path" in str(info.value)
    with pytest.raises(ValueError, match="`eval_split`"):
        load_config(None, ["--task", "openai/gsm8k", "--eval_split", "train"])


def test_presets_fit_their_context_and_do_not_truncate_by_construction():
    from scaledrun.config import CONTEXT_LENGTHS, PRESETS

    for name in PRESETS:
        cfg = load_config(None, ["--preset", name])
        if cfg.model in CONTEXT_LENGTHS:
            assert cfg.max_prompt_length is not None, name
            assert cfg.max_prompt_length + cfg.max_new_tokens <= CONTEXT_LENGTHS[cfg.model], name
        if cfg.model.startswith("Qwen/Qwen3"):
            thinking = (cfg.chat_template_kwargs or {}).get("enable_thinking", True)
            # a thinking model needs thousands of tokens; the 16 of the tiny run would cut every completion
            assert cfg.max_new_tokens >= (4096 if thinking else 256), name
    assert {"qwen2.5-math-7b", "qwen3-8b"} <= set(PRESETS)


def _loss_without_params(logp, old_logp, advantages, mask, group, *, aggregation="token-mean", **params):
    raise AssertionError("not called")  # pragma: no cover


def test_an_objective_without_a_params_class_refuses_every_objective_field():
    """An objective registered without a parameter class takes none of them: `--epsilon_low 0.3` or
    `--transform orth_proj` used to be dropped silently (the loss received {}); now refused by name."""
    from cancellation.objectives import OBJECTIVES, PARAMS, register

    register("scratch_no_params")(_loss_without_params)
    try:
        cfg = load_config(None, ["--objective", "scratch_no_params"])
        assert cfg.objective_params() == {}  # nothing set: the loss gets no objective parameter
        for option, value in (("epsilon_low", "0.3"), ("transform", "orth_proj"), ("stop_grad", "false")):
            with pytest.raises(ValueError) as err:
                load_config(None, ["--objective", "scratch_no_params", f"--{option}", value])
            assert str(err.value).startswith(f"config field `{option}`=") and str(err.value).endswith(
                "objective 'scratch_no_params' does not take it (it takes: none)"
            )
    finally:
        OBJECTIVES.pop("scratch_no_params", None)
        PARAMS.pop("scratch_no_params", None)


def test_a_bool_field_takes_only_a_real_bool():
    """The config's bool fields and the objective parameters share one coercer (``cancellation.params``)."""
    for value in ("false", 0, 1):
        with pytest.raises(ValueError) as err:
            RunConfig(stop_grad=value)
        assert str(err.value) == f"config field `stop_grad`={value!r}: expected true or false"
