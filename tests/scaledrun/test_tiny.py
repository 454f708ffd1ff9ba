"""The tiny Qwen3 model: built once per session, loaded back through from_pretrained like a real run."""

from __future__ import annotations

import json

import pytest
import torch

from scaledrun.tasks import TASKS, format_prompt, load_task
from scaledrun.tiny import DEFAULT_STOP_ACCURACY, DEFAULT_WARM_START_STEPS, STOP_CHECK_EVERY, build_tiny, main

from ..conftest import SEED

#: trains or samples the tiny model (``tests/machines.py`` reruns it as other machines would)
pytestmark = pytest.mark.sampling


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    """The README's ``python -m scaledrun.tiny --out DIR`` (default warm start), and what it printed."""
    import contextlib
    import io

    out = tmp_path_factory.mktemp("tiny") / "model"
    printed = io.StringIO()
    threads = torch.get_num_threads()
    with contextlib.redirect_stdout(printed):
        main(["--out", str(out), "--seed", str(SEED)])
    torch.set_num_threads(threads)  # the command runs on one thread; the suite's setting comes back
    return out, printed.getvalue()


@pytest.fixture(scope="session")
def tiny_dir(built):
    return built[0]


@pytest.fixture(scope="session")
def loaded(tiny_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_dir).eval(), AutoTokenizer.from_pretrained(tiny_dir)


def test_loads_through_from_pretrained(loaded):
    model, tok = loaded
    cfg = model.config
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (
        64,
        2,
        4,
        2,
    )
    assert (
        cfg.tie_word_embeddings
        and model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    )
    assert cfg.vocab_size == len(tok)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|pad|>" and tok.padding_side == "left"
    assert model.generation_config.eos_token_id == tok.eos_token_id
    assert model.generation_config.pad_token_id == tok.pad_token_id
    # parameter count by hand: tied embedding + per layer (q, k, v, o, q/k norms, 3 MLP mats, 2 norms) + final norm
    v, h, kv, inter, hd = len(tok), 64, 2 * 16, 128, 16
    per_layer = h * h + 2 * h * kv + h * h + 2 * hd + 3 * h * inter + 2 * h
    assert sum(p.numel() for p in model.parameters()) == v * h + 2 * per_layer + h


@pytest.mark.parametrize("task", list(TASKS))
def test_tokenizer_round_trips_task_text(loaded, task):
    _, tok = loaded
    for t in load_task(task, "eval", 30, seed=5, ops="+-"):
        for text in (t.prompt, t.answer, t.solution):
            assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text
    # numbers are digit sequences: one token per digit
    ids = tok("1234", add_special_tokens=False)["input_ids"]
    assert [tok.decode([i]) for i in ids] == ["1", "2", "3", "4"]


def test_chat_template_is_chatml(loaded):
    _, tok = loaded
    assert (
        format_prompt(tok, "What is 2 + 3?")
        == "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tok(format_prompt(tok, "hi"), add_special_tokens=False)["input_ids"]
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>")
    assert tok.convert_tokens_to_ids("<|im_end|>") in ids


def test_generate_left_padded_matches_unpadded_and_stops_at_eos(loaded):
    """A left-padded batch generates what each prompt generates alone, up to floating-point ties.

    The padded and unpadded passes sum in different orders, so their logits differ by rounding: a
    greedy choice between two logits closer than that may go either way on a given CPU. So each
    batched token must be the unpadded pass's argmax up to ``TIE`` (teacher-forced on the batched
    row), and after EOS the row holds only padding.
    """
    tie = 1e-4
    model, tok = loaded
    prompts = [format_prompt(tok, p) for p in ("What is 3 + 4?", "What is 53 + 48?", "Hi")]
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    assert (enc["attention_mask"][:, 0] == 0).any()  # some row is left-padded
    with torch.no_grad():
        batch = model.generate(**enc, do_sample=False, max_new_tokens=12)
    width = enc["input_ids"].shape[1]
    for i, p in enumerate(prompts):
        one = tok(p, return_tensors="pt", add_special_tokens=False)["input_ids"]
        row = batch[i, width:].tolist()
        end = row.index(tok.eos_token_id) + 1 if tok.eos_token_id in row else len(row)
        assert all(t == tok.pad_token_id for t in row[end:])
        ids = torch.cat([one, torch.tensor([row[:end]])], 1)
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, one.shape[1] - 1 : -1]  # the logit of each row token
        chosen = logits.gather(-1, torch.tensor(row[:end])[:, None])[:, 0]
        assert bool((chosen >= logits.max(-1).values - tie).all()), (p, row[:end])


def test_warm_start_stops_at_the_target_accuracy(built, loaded):
    """The default warm start ends at the first probe check that reaches ``DEFAULT_STOP_ACCURACY`` (or
    runs every step); the record, the printed line and a greedy pass over the held-out prompts agree."""
    tiny_dir, printed = built
    model, tok = loaded
    rec = json.loads((tiny_dir / "warm_start.json").read_text())
    losses, checks = rec["losses"], rec["probe_checks"]
    assert (
        rec["stop_accuracy"] == DEFAULT_STOP_ACCURACY and rec["warm_start_steps"] == DEFAULT_WARM_START_STEPS
    )
    assert [step for step, _ in checks] == list(range(STOP_CHECK_EVERY, len(losses) + 1, STOP_CHECK_EVERY))[
        : len(checks)
    ]
    assert all(acc < DEFAULT_STOP_ACCURACY for _, acc in checks[:-1])  # no earlier check reached it
    reached = checks[-1][1] >= DEFAULT_STOP_ACCURACY
    assert len(losses) == (checks[-1][0] if reached else DEFAULT_WARM_START_STEPS)
    assert sum(losses[-10:]) / 10 < 0.5 * sum(losses[:10]) / 10
    # greedy accuracy recomputed here from the saved model, by plain string comparison
    held = load_task("arithmetic", "eval", 100, seed=SEED, ops="+")
    enc = tok(
        [format_prompt(tok, t.prompt) for t in held],
        return_tensors="pt",
        padding=True,
        add_special_tokens=False,
    )
    with torch.no_grad():
        gen = model.generate(**enc, do_sample=False, max_new_tokens=6)
    texts = tok.batch_decode(gen[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    acc = sum(text.strip() == t.answer for text, t in zip(texts, held, strict=True)) / len(held)
    assert acc == pytest.approx(rec["accuracy_after"])
    assert rec["accuracy_before"] < acc
    how = f"stopped at step {len(losses)}" if reached else f"{len(losses)} steps: did NOT reach"
    assert f"warm start {how}" in printed and f"-> {acc:.2f}" in printed, printed


def test_build_tiny_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="valid: arithmetic"):
        build_tiny(tmp_path, "chess")
    with pytest.raises(ValueError, match="warm_start_steps"):
        build_tiny(tmp_path, "arithmetic", warm_start_steps=-1)


@pytest.mark.parametrize(
    ("value", "message"), [("2", "must be in (0, 1]"), ("half", "must be a number in (0, 1]")]
)
def test_stop_at_accuracy_rejects_bad_values(tmp_path, capsys, value, message):
    with pytest.raises(SystemExit) as exit_info:
        main(["--out", str(tmp_path / "m"), "--stop-at-accuracy", value])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "m").exists()  # nothing built


def test_stop_at_accuracy_none_trains_every_step():
    from scaledrun.tiny import _stop_accuracy

    assert _stop_accuracy("none") is None and _stop_accuracy("off") is None and _stop_accuracy("0.4") == 0.4
