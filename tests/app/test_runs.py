"""Runs page: real ``scaledrun.train`` runs on the tiny model as fixtures; the headline reward (the mean of
the last 10 steps, as the run's last line) and the table values equal the ones computed by hand from each
run's metrics.jsonl, and the headline ranks two runs as their last lines do where their last steps rank
them the other way; a missing folder, an empty folder and a
malformed metrics file show messages, not tracebacks (the first two on the page itself, with the commands
that make a first run there, checked against the trainer's own parsers). Steps to threshold reads full
windows only and its default threshold is relative to the runs (checked on synthetic metrics whose answer
is known by hand); a single run folder entered as the folder is picked, also after switching from its parent.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import math
import shlex
import shutil
import zlib
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from cancellation.diagnostics import jitter2
from scaledrun.config import RunConfig, load_config
from scaledrun.rewards import REWARDS, register_reward
from scaledrun.runlog import read_metrics, run_summary
from scaledrun.tiny import build_tiny
from scaledrun.tiny import main as tiny_main
from scaledrun.train import train

from ..exactness import rounding_tolerance

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "app/views/runs.py"
#: the row keys the page draws as curves (those with a finite value in some picked run)
RUN_CURVES = (
    "reward/mean", "eval/greedy_accuracy", "shared_residual", "group_shared_residual",
    "sequence_net_residual", "asym", "clip/low_frac", "clip/high_frac", "entropy", "kl",
    "completion_length", "energy/bucket_0", "energy/bucket_1", "energy/bucket_2", "flip/rate",
)  # fmt: skip
RESIDUALS = ("shared_residual", "group_shared_residual", "sequence_net_residual")
#: two tiny runs: (folder name, objective params)
RUNS = {"grpo_run": {"objective": "grpo"}, "dfpo_run": {"objective": "dfpo", "transform": "orth_proj"}}
#: a reward that varies between completions (the untrained tiny model never gets an answer right, and a
#: constant reward would make every displayed number 0)
HASH_REWARD = "test_runs_page_hash"

if HASH_REWARD not in REWARDS:

    @register_reward(HASH_REWARD)
    def _hash_reward(prompts, completions, answers):
        """crc32(completion) % 101 / 100."""
        return [(zlib.crc32(c.encode()) % 101) / 100.0 for c in completions]


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory) -> Path:
    """A folder with two 3-step runs of the tiny model (no warm start: seconds on CPU)."""
    root = tmp_path_factory.mktemp("runs_page")
    model = build_tiny(root / "model", "arithmetic", seed=0, warm_start_steps=0)
    runs = root / "runs"
    for name, params in RUNS.items():
        cfg = RunConfig(
            model=str(model), group_size=4, prompts_per_step=2, max_new_tokens=6, truncation="keep", steps=3,
            eval_every=0, save_every=0, num_train=16, num_eval=0, reward=HASH_REWARD, output_dir=str(runs / name), **params,
        )  # fmt: skip
        train(cfg)
    return runs


def _page(folder: Path | str, **state) -> AppTest:
    at = AppTest.from_file(str(PAGE), default_timeout=120)
    at.session_state["runs_dir"] = str(folder)
    for k, v in state.items():
        at.session_state[k] = v
    at.run()
    assert not at.exception, at.exception
    return at


def _metric(at: AppTest, label: str) -> str:
    found = [m for m in at.metric if m.label == label]
    assert len(found) == 1, [m.label for m in at.metric]
    return found[0].value


def test_final_reward_and_table_match_metrics_file(runs_dir):
    at = _page(runs_dir)
    assert sorted(at.sidebar.multiselect(key="runs").value) == sorted(RUNS)
    table = at.dataframe[0].value
    for name, params in RUNS.items():
        # the values as the trainer wrote them, read back by plain json (not the page's reader)
        lines = [json.loads(x) for x in (runs_dir / name / "metrics.jsonl").read_text().splitlines()]
        rewards = [r["reward/mean"] for r in lines]
        label = f"{name} · {params['objective']}" + (
            f" {params['transform']}" if "transform" in params else ""
        )
        # the headline: the mean of the run's (3, fewer than 10) steps, as its last line reports it
        assert _metric(at, f"{label} · mean of the last 3 steps") == f"{sum(rewards) / 3:.4f}"
        row = table.loc[label]
        assert row["steps"] == lines[-1]["step"] == 3
        assert list(row.index) == [
            "steps", "reward, last 10", "last eval accuracy", "steps to threshold", "Jitter₂ reward"
        ]  # fmt: skip
        assert math.isnan(row["last eval accuracy"])  # num_eval=0: no eval
        # Jitter₂ (eq. 20) of the per-step reward, by hand
        m = [r["reward/mean"] for r in lines]
        by_hand = sum(abs(m[t + 2] - 2 * m[t + 1] + m[t]) for t in range(len(m) - 2)) / (len(m) - 2)
        assert row["Jitter₂ reward"] == pytest.approx(by_hand)
        assert row["Jitter₂ reward"] == pytest.approx(jitter2(m))
    # the curves: one figure per metric with values, one trace per run
    with_values = {
        k
        for name in RUNS
        for r in read_metrics(runs_dir / name)
        for k, v in r.items()
        if k in RUN_CURVES and math.isfinite(v)
    }
    assert {"reward/mean", "asym", "clip/low_frac", "entropy"} <= with_values
    assert len(at.get("plotly_chart")) == len(with_values)


def _array(data) -> list[float]:
    """A plotly trace array as floats: a list, or plotly's typed-array form {"dtype", "bdata"} (base64)."""
    if isinstance(data, dict):
        return np.frombuffer(base64.b64decode(data["bdata"]), dtype=np.dtype(data["dtype"])).tolist()
    return [float(x) for x in data]


@pytest.mark.exactness  # DFPO's residual at the float32 rounding bound of its sums
def test_residual_curves_are_the_logged_values_and_the_notes_are_shown(runs_dir):
    at = _page(runs_dir, window=1)  # window 1: the curves are the raw logged values
    charts = {json.loads(c.proto.spec)["layout"]["yaxis"]["title"]["text"]: c for c in at.get("plotly_chart")}
    for name, params in RUNS.items():
        label = f"{name} · {params['objective']}" + (
            f" {params['transform']}" if "transform" in params else ""
        )
        lines = [json.loads(x) for x in (runs_dir / name / "metrics.jsonl").read_text().splitlines()]
        for key in RESIDUALS:
            logged = [(r["step"], r[key]) for r in lines if r.get(key) is not None and math.isfinite(r[key])]
            if not logged:  # e.g. no prefix shared by two completions of the untrained model: NaN (null)
                assert key != "sequence_net_residual", name  # every step with an update has one
                continue
            (trace,) = [t for t in json.loads(charts[key].proto.spec)["data"] if t.get("name") == label]
            assert _array(trace["x"]) == [x for x, _ in logged]
            assert _array(trace["y"]) == pytest.approx([y for _, y in logged], abs=1e-15)
        if params["objective"] == "dfpo":  # DFPO's sequence-level cancellation, whatever the lengths
            # |net| / gross of a group's G·T + G float32 terms (G = 4 rows of T = 6 tokens, Â a mean over G): 0
            # up to their rounding (as tests/scaledrun/test_update.py's RESIDUAL_TOL), not a fixed 1e-6
            tol = rounding_tolerance(1.0, 4 * 6 + 4)
            assert max(r["sequence_net_residual"] for r in lines) <= tol
    captions = " ".join(c.value for c in at.caption)
    assert "α = 1/|y_i|" in captions and "sequence-net residual" in captions
    assert "first mini-batch of each step" in captions and "last mini-batch only" in captions


def test_inputs_rerun(runs_dir):
    at = _page(runs_dir)
    at.sidebar.multiselect(key="runs").set_value(["grpo_run"]).run()
    assert not at.exception
    assert len(at.metric) == 1
    at.sidebar.slider(key="window").set_value(1).run()
    assert not at.exception
    at.sidebar.number_input(key="threshold").set_value(0.0).run()
    assert not at.exception
    # threshold 0 is reached at the first step
    assert (
        at.dataframe[0].value["steps to threshold"].iloc[0] == read_metrics(runs_dir / "grpo_run")[0]["step"]
    )
    at.sidebar.multiselect(key="runs").set_value([]).run()
    assert not at.exception
    assert "Pick one or more runs" in at.info[0].value


def _sidebar_texts(at: AppTest) -> list[str]:
    """Every message, text and caption in the sidebar (the folder input's own value excluded)."""
    sb = at.sidebar
    return [
        e.value for kind in (sb.error, sb.warning, sb.info, sb.markdown, sb.caption, sb.code) for e in kind
    ]


def _commands(at: AppTest) -> list[list[str]]:
    """The shell commands of the page's code block (comments left out), split as the shell would."""
    (block,) = at.code
    return [shlex.split(line) for line in block.value.splitlines() if line and not line.startswith("#")]


def _check_commands(at: AppTest, runs_folder: Path) -> None:
    """The page's two commands are the real ones: ``scaledrun.tiny``'s own parser knows ``--out``, the tiny
    model goes where the config's model is read from, and the training command, parsed by the trainer's own
    config loader, trains into a folder under ``runs_folder``."""
    tiny, trainer = _commands(at)
    assert tiny[:3] == ["python", "-m", "scaledrun.tiny"]
    assert trainer[:3] == ["python", "-m", "scaledrun.train"]
    help_text = io.StringIO()
    with contextlib.redirect_stdout(help_text), pytest.raises(SystemExit) as stop:
        tiny_main(["--help"])  # argparse prints the options and exits 0
    assert stop.value.code == 0 and "--out" in help_text.getvalue()
    assert tiny[3:] == ["--out", "artifacts/tiny-qwen3"]
    out = tiny[tiny.index("--out") + 1]
    args = trainer[3:]
    config = args.pop(args.index("--config") + 1)
    args.remove("--config")
    cfg = load_config(str(REPO / config), args)  # the README's quick start, as the trainer reads it
    assert cfg.model == out == "artifacts/tiny-qwen3"
    assert (config, cfg.objective) == ("scaledrun/configs/offpolicy.yaml", "grpo")
    assert Path(cfg.output_dir) == runs_folder.resolve() / "offpolicy-grpo"


def test_missing_default_folder_says_so_on_the_page_with_the_commands(runs_dir, tmp_path, monkeypatch):
    """The reported case: the default folder ``runs`` does not exist (a fresh clone). The page names it and
    shows the commands that make a run into it; the sidebar holds only the input (the old page put its
    message there, suggesting ``runs``, the value already typed). Following the commands lists the run."""
    monkeypatch.delenv("CANCELLATION_RUNS_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    at = AppTest.from_file(str(PAGE), default_timeout=60)
    at.run()
    assert not at.exception
    assert at.sidebar.text_input(key="runs_dir").value == "runs"
    assert _sidebar_texts(at) == []
    (error,) = at.main.error
    assert error.value.startswith(f"The folder `runs` (`{tmp_path.resolve() / 'runs'}`) does not exist.")
    assert error.value.count("runs`") == 2  # named once (as typed and resolved), suggested nowhere
    _check_commands(at, tmp_path / "runs")
    # what the commands make: a run folder at the commanded output_dir (a fixture run copied there)
    (trainer,) = [c for c in _commands(at) if "scaledrun.train" in c]
    shutil.copytree(runs_dir / "grpo_run", trainer[trainer.index("--output_dir") + 1])
    at.run()
    assert not at.exception and not at.error and not at.warning
    assert at.sidebar.multiselect(key="runs").options == ["offpolicy-grpo"]
    assert [m.label for m in at.metric] == ["offpolicy-grpo · grpo · mean of the last 3 steps"]


def test_empty_folder_says_no_runs_were_found_with_the_commands(tmp_path):
    (tmp_path / "not_a_run").mkdir()  # a sub-folder without metrics.jsonl and config.yaml
    at = _page(tmp_path)
    assert _sidebar_texts(at) == []
    (warning,) = at.main.warning
    assert warning.value.startswith(f"No runs were found in the folder `{tmp_path}`.")
    assert "metrics.jsonl" in warning.value and "config.yaml" in warning.value
    _check_commands(at, tmp_path)
    assert not at.get("plotly_chart") and not at.dataframe


def test_missing_folder_and_a_file_are_named(tmp_path):
    at = _page(tmp_path / "nope")
    assert _sidebar_texts(at) == []
    (error,) = at.main.error
    assert error.value.startswith(f"The folder `{tmp_path / 'nope'}` does not exist.")
    _check_commands(at, tmp_path / "nope")
    (tmp_path / "file.txt").write_text("not a folder")
    at = _page(tmp_path / "file.txt")
    (error,) = at.main.error
    assert error.value.startswith(f"`{tmp_path / 'file.txt'}` is a file, not a folder.")
    assert not at.code and _sidebar_texts(at) == []


def test_malformed_metrics_file(runs_dir, tmp_path):
    bad = tmp_path / "bad_run"
    shutil.copytree(runs_dir / "grpo_run", bad)
    with (bad / "metrics.jsonl").open("a") as f:
        f.write('{"step": 4, "reward/mean": 0.5\n')  # a truncated line
    at = _page(tmp_path)
    assert "cannot be read" in at.error[0].value and "line 4" in at.error[0].value
    (bad / "metrics.jsonl").write_text('{"step": 1, "reward/mean": "high"}\n')
    at = _page(tmp_path)
    assert "not a number" in at.error[0].value


def test_nan_values_read_as_gaps(runs_dir, tmp_path):
    """null (the trainer's NaN) is read as NaN and left out of the headline's mean, not shown as a number."""
    run = tmp_path / "nan_run"
    shutil.copytree(runs_dir / "grpo_run", run)
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    lines[-1]["reward/mean"] = None
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    at = _page(tmp_path)
    expected = (lines[0]["reward/mean"] + lines[1]["reward/mean"]) / 2
    (metric,) = at.metric
    assert metric.label.endswith("mean of the last 2 steps")
    assert metric.value == f"{expected:.4f}"
    assert not math.isnan(float(metric.value))


def _synthetic_run(folder: Path, config_from: Path, rewards: list[float]) -> Path:
    """A run folder with a real run's config.yaml and a metrics.jsonl of steps 1.. with these rewards."""
    folder.mkdir(parents=True)
    shutil.copy(config_from / "config.yaml", folder / "config.yaml")
    rows = [{"step": i + 1, "reward/mean": r} for i, r in enumerate(rewards)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


#: a run that starts high by chance, drops, then learns; with a window of 4 its full-window trailing
#: means (steps 4..10) are, by hand: 0.3, 0.125, 0.2, 0.325, 0.5, 0.65, 0.75
FAST = [0.9, 0.1, 0.1, 0.1, 0.2, 0.4, 0.6, 0.8, 0.8, 0.8]
#: a run that never moves: every full-window mean is 0.2
FLAT = [0.2] * 10


#: two 12-step runs whose last step and last-10 mean rank them opposite ways (the first hour's case: the
#: last step read 0.4688 against 0.5938 where the runs' last lines said 0.562 against 0.547). By hand:
#: STEADY's last 10 steps average (9·0.6 + 0.2)/10 = 0.56, LUCKY's (9·0.3 + 0.5)/10 = 0.32; their last steps
#: are 0.2 < 0.5; their first two steps (outside the window) would reverse the order again if counted
STEADY = [0.0, 0.0] + [0.6] * 9 + [0.2]
LUCKY = [0.9, 0.9] + [0.3] * 9 + [0.5]


def test_the_headline_is_the_last_10_steps_mean_the_run_s_last_line_reports(runs_dir, tmp_path):
    """The headline ranks the runs as their last lines do (the last-10 mean), not by their last step."""
    _synthetic_run(tmp_path / "steady", runs_dir / "grpo_run", STEADY)
    _synthetic_run(tmp_path / "lucky", runs_dir / "grpo_run", LUCKY)
    at = _page(tmp_path)
    steady = _metric(at, "steady · grpo · mean of the last 10 steps")
    lucky = _metric(at, "lucky · grpo · mean of the last 10 steps")
    assert (steady, lucky) == ("0.5600", "0.3200")
    assert float(steady) > float(lucky) and STEADY[-1] < LUCKY[-1]  # the last step ranks them the other way
    # the last step's own value is in the metric's help
    helps = {m.label: m.help for m in at.metric}
    assert "the last step alone: 0.2000" in helps["steady · grpo · mean of the last 10 steps"]
    # the same number as the trainer's last line for these rows
    for name, rewards in (("steady", STEADY), ("lucky", LUCKY)):
        rows = read_metrics(tmp_path / name)
        line = run_summary(tmp_path / name, rows, 0, 1.0)
        assert f"reward {sum(rewards[-10:]) / 10:.3f} (mean of the last 10 steps)" in line, line
    # the table's full-window mean at the default window (10) is the same mean
    table = at.dataframe[0].value
    assert table.loc["steady · grpo", "reward, last 10"] == pytest.approx(0.56, abs=1e-12)
    assert table.loc["lucky · grpo", "reward, last 10"] == pytest.approx(0.32, abs=1e-12)


def test_steps_to_threshold_reads_full_windows_and_the_default_is_relative(runs_dir, tmp_path):
    """The first step alone (a partial window) no longer reaches the threshold: the old page said 1 here.
    Auto threshold by hand: halfway from the highest start (0.3) to the best level (0.75) = 0.525, first
    reached at step 9 (0.65); the flat run never reaches it."""
    _synthetic_run(tmp_path / "fast", runs_dir / "grpo_run", FAST)
    _synthetic_run(tmp_path / "flat", runs_dir / "grpo_run", FLAT)
    at = _page(tmp_path, window=4)
    assert at.sidebar.number_input(key="threshold").value is None  # auto
    table = at.dataframe[0].value
    assert table.loc["fast · grpo", "steps to threshold"] == 9
    assert math.isnan(table.loc["flat · grpo", "steps to threshold"])
    assert table.loc["fast · grpo", "reward, last 4"] == pytest.approx(0.75)
    assert table.loc["flat · grpo", "reward, last 4"] == pytest.approx(0.2)
    captions = " ".join(c.value for c in at.caption)
    assert "auto = 0.525" in captions
    # a fixed threshold the first step alone exceeds (the old default 0.35): reached at step 8 (0.5), not 1
    at.sidebar.number_input(key="threshold").set_value(0.35).run()
    assert not at.exception
    table = at.dataframe[0].value
    assert table.loc["fast · grpo", "steps to threshold"] == 8
    assert math.isnan(table.loc["flat · grpo", "steps to threshold"])
    assert "0.35, as entered" in " ".join(c.value for c in at.caption)
    # window 1: every row is a full window, so the first step (0.9) reaches 0.35
    at.sidebar.slider(key="window").set_value(1).run()
    assert at.dataframe[0].value.loc["fast · grpo", "steps to threshold"] == 1


def test_a_run_shorter_than_the_window_has_no_steps_to_threshold(runs_dir):
    """The fixture runs have 3 steps: with the default window (10) no window is full, so nothing is reached
    and no automatic threshold exists; the caption says to lower the window."""
    at = _page(runs_dir)
    table = at.dataframe[0].value
    assert table["steps to threshold"].isna().all()
    assert table["reward, last 10"].isna().all()
    assert "no run has a full window of 10 steps" in " ".join(c.value for c in at.caption)


def test_a_single_run_folder_is_picked(runs_dir):
    """The help text allows a run folder itself: it is offered under its own name and picked."""
    at = _page(runs_dir / "grpo_run")
    assert at.sidebar.multiselect(key="runs").options == ["grpo_run"]
    assert at.sidebar.multiselect(key="runs").value == ["grpo_run"]
    rewards = [r["reward/mean"] for r in read_metrics(runs_dir / "grpo_run")]
    assert _metric(at, "grpo_run · grpo · mean of the last 3 steps") == f"{sum(rewards) / 3:.4f}"
    assert list(at.dataframe[0].value.index) == ["grpo_run · grpo"]
    assert not at.info and not at.warning and not at.error


def test_switching_folders_picks_the_new_folders_runs(runs_dir, tmp_path):
    """Going from the folder of runs to one run folder (the reported case: nothing was selected) and back;
    in the same folder a new run leaves the picks as they were."""
    at = _page(runs_dir)
    at.sidebar.text_input(key="runs_dir").set_value(str(runs_dir / "dfpo_run")).run()
    assert not at.exception
    assert at.sidebar.multiselect(key="runs").value == ["dfpo_run"]
    assert [m.label for m in at.metric] == ["dfpo_run · dfpo orth_proj · mean of the last 3 steps"]
    at.sidebar.text_input(key="runs_dir").set_value(str(runs_dir)).run()
    assert sorted(at.sidebar.multiselect(key="runs").value) == sorted(RUNS)
    # the same folder, a run added: the user's picks stay
    root = tmp_path / "runs"
    for name in RUNS:
        shutil.copytree(runs_dir / name, root / name)
    at = _page(root)
    at.sidebar.multiselect(key="runs").set_value(["dfpo_run"]).run()
    shutil.copytree(runs_dir / "grpo_run", root / "another_run")
    at.run()
    assert not at.exception
    assert at.sidebar.multiselect(key="runs").options == ["another_run", "dfpo_run", "grpo_run"]
    assert at.sidebar.multiselect(key="runs").value == ["dfpo_run"]


def test_run_folders_two_levels_down_are_listed_by_their_path(runs_dir, tmp_path):
    """A sweep's ``<arm>/seed<k>`` folders (experiments/lm.py) are offered as ``arm/seed<k>``; a run folder
    one level down is still offered by its name, and nothing inside a run folder is taken for a run."""
    shutil.copytree(runs_dir / "grpo_run", tmp_path / "grpo" / "seed0")
    shutil.copytree(runs_dir / "dfpo_run", tmp_path / "dfpo" / "seed1")
    shutil.copytree(runs_dir / "grpo_run", tmp_path / "single")
    shutil.copytree(runs_dir / "dfpo_run", tmp_path / "single" / "nested")  # inside a run: not scanned
    at = _page(tmp_path)
    assert at.sidebar.multiselect(key="runs").options == ["dfpo/seed1", "grpo/seed0", "single"]
    rewards = [r["reward/mean"] for r in read_metrics(runs_dir / "dfpo_run")]
    assert _metric(at, "dfpo/seed1 · dfpo orth_proj · mean of the last 3 steps") == f"{sum(rewards) / 3:.4f}"
