"""The ``template_forms`` task (two equally correct forms), its warm start, and the trainer's exact
equivalent-solution eval (``eval/form_entropy``, ``eval/form_mass``, ``eval/form_logodds``)."""

from __future__ import annotations

import math

import pytest
import torch

from scaledrun.config import RunConfig
from scaledrun.data import load_tasks
from scaledrun.evaluate import FORM_KEYS, HEAD_KEY, evaluate, form_stats, shared_head
from scaledrun.rewards import exact_match
from scaledrun.tasks import TASKS, Task, format_prompt, load_task
from scaledrun.tiny import EOS_TOKEN, _sft_batch, _tokenizer_corpus, make_model, train_tokenizer, warm_start

from ..exactness import close

TEMPERATURE = 0.7


def test_forms_hand_worked():
    add = TASKS["template_forms"](37, "+", 45)
    assert add.prompt == "Compute 37 + 45. Explain briefly and end with 'The answer is N.'"
    assert add.answer == "82"
    assert add.forms == (
        "Let me compute 37 + 45. The sum of 37 and 45 is 82. The answer is 82.",
        "Let me compute 37 + 45. Adding 37 and 45 gives 82. The answer is 82.",
    )
    assert add.solution == add.forms[0] == TASKS["template"](37, "+", 45).solution
    sub = TASKS["template_forms"](73, "-", 45)
    assert sub.forms == (
        "Let me compute 73 - 45. The difference of 73 and 45 is 28. The answer is 28.",
        "Let me compute 73 - 45. Subtracting 45 from 73 gives 28. The answer is 28.",
    )
    # the other tasks keep a single reference
    for name in ("arithmetic", "arithmetic_words", "template"):
        t = TASKS[name](37, "+", 45)
        assert t.forms == () and t.references == (t.solution,)


@pytest.mark.parametrize("split", ["train", "eval"])
def test_both_forms_are_rewarded_and_differ(split):
    tasks = load_task("template_forms", split, 200, seed=1, ops="+-")
    assert {t.prompt.split()[2] for t in tasks} == {"+", "-"}
    for t in tasks:
        assert len(t.forms) == 2 and t.forms[0] == t.solution and t.forms[0] != t.forms[1]
        # a shared template: same first sentence and same final sentence
        first, last = (
            t.prompt.split(".")[0].replace("Compute", "Let me compute"),
            f"The answer is {t.answer}.",
        )
        assert all(f.startswith(first + ". ") and f.endswith(" " + last) for f in t.forms)
        wrong = t.forms[1].replace(last, f"The answer is {int(t.answer) + 1}.")
        rewards = exact_match([t.prompt] * 3, [*t.forms, wrong], [t.answer] * 3)
        assert rewards == [1.0, 1.0, 0.0]


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(_tokenizer_corpus("template_forms", 0))


def test_warm_start_sees_both_forms_equally(tokenizer):
    tasks = load_task("template_forms", "train", 20, seed=0, ops="+-")
    corpus = set(_tokenizer_corpus("template_forms", 0))
    assert all(
        f in corpus for t in load_task("template_forms", "eval", 50, seed=0, ops="+-") for f in t.forms
    )
    ids, _, labels = _sft_batch(tokenizer, tasks)
    assert ids.shape[0] == 2 * len(tasks)
    targets = [tokenizer.decode([i for i in row.tolist() if i != -100]) for row in labels]
    # one row per (problem, form), forms in order: both forms of every problem, each once
    assert targets == [f + EOS_TOKEN for t in tasks for f in t.forms]
    # single-form tasks still give one row each
    single = load_task("template", "train", 20, seed=0, ops="+-")
    ids1, _, labels1 = _sft_batch(tokenizer, single)
    assert ids1.shape[0] == len(single)
    assert tokenizer.decode([i for i in labels1[3].tolist() if i != -100]) == single[3].solution + EOS_TOKEN


@pytest.fixture(scope="module")
def model_dir(tokenizer, tmp_path_factory):
    """A tiny Qwen3 briefly warm-started on both forms (so the two forms get unequal, non-negligible mass)."""
    model = make_model(len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id, seed=0)
    train = load_task("template_forms", "train", 200, seed=0, ops="+")
    warm_start(model, tokenizer, train, steps=25, batch_size=16, lr=1e-2)
    out = tmp_path_factory.mktemp("forms") / "model"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _loop_logp(model, tok, prompt: str, form: str, temperature: float, eos: bool = True) -> float:
    """log π(form + EOS | prompt) (``eos=False``: of the form's tokens alone): one unpadded sequence,
    log_softmax(logits / T), gather, sum."""
    p = tok(format_prompt(tok, prompt), add_special_tokens=False)["input_ids"]
    c = tok(form, add_special_tokens=False)["input_ids"] + ([tok.eos_token_id] if eos else [])
    with torch.no_grad():
        logits = model(torch.tensor([p + c])).logits[0].double()
    total = 0.0
    for j, token in enumerate(c):
        logsm = torch.log_softmax(logits[len(p) + j - 1] / temperature, dim=-1)
        total += float(logsm[token])
    return total


@pytest.mark.exactness
@pytest.mark.parametrize("rows", [3, 0])  # 3 rows per pass: a prompt's forms split over two passes
def test_evaluate_form_metrics_equal_a_plain_loop(model_dir, rows):
    """The batched, padded form metrics = one unpadded sequence at a time, model in float64 (the
    batched and the loop passes sum in another order: ``tests/exactness.py``)."""
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = RunConfig(
        model=str(model_dir), task="template_forms", num_eval=7, eval_k=1, max_new_tokens=4,
        temperature=TEMPERATURE, micro_batch_size=rows,
    )  # fmt: skip
    tok = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64)
    model.train()  # evaluate must switch dropout off itself and restore the mode
    # 2- and 3-digit problems: prompts of unequal length (left padding) and forms of unequal length
    tasks = load_task("template_forms", "eval", 4, seed=0, ops="+-") + load_task(
        "template_forms", "eval", 3, seed=0, digits=3, ops="+"
    )
    prompt_lens = {len(tok(format_prompt(tok, t.prompt))["input_ids"]) for t in tasks}
    assert len(prompt_lens) > 1  # the batch is left-padded somewhere (and forms differ in length)
    out = evaluate(cfg, Accelerator(cpu=True), model, tok, tasks)
    assert model.training

    model.eval()
    ent, mass, odds, gross = [], [], [], 0.0
    for t in tasks:
        lp = [_loop_logp(model, tok, t.prompt, f, TEMPERATURE) for f in t.forms]
        gross += (abs(lp[0]) + abs(lp[1])) / len(tasks)  # the log-odds' terms, at their magnitude
        z = math.exp(lp[0]) + math.exp(lp[1])
        q = [math.exp(v) / z for v in lp]
        ent.append(-sum(x * math.log(x) for x in q))
        mass.append(z)
        odds.append(lp[0] - lp[1])
    expected = {
        "eval/form_entropy": sum(ent) / len(tasks),
        "eval/form_mass": sum(mass) / len(tasks),
        "eval/form_logodds": sum(odds) / len(tasks),
    }
    # the fixture makes the numbers non-trivial: prompts with mixed forms, prompts collapsed onto one
    assert 0.05 < expected["eval/form_entropy"] < math.log(2) - 0.01
    assert min(abs(v) for v in odds) < 3 < max(abs(v) for v in odds)
    # entropies of order 1; the log-odds at the scale of the log-probs they subtract
    assert close(out["eval/form_entropy"], expected["eval/form_entropy"], gross=1.0)
    assert close(out["eval/form_logodds"], expected["eval/form_logodds"], gross=gross)
    # the mass of a barely trained model is tiny (wrong digits), so compare it relatively
    assert close(out["eval/form_mass"], expected["eval/form_mass"])
    # the shared head "Let me compute a op b." without EOS, summed the same way
    heads = [_loop_logp(model, tok, t.prompt, f"Let me compute {t.prompt.split('.')[0][8:]}.", TEMPERATURE,
                        eos=False) for t in tasks]  # fmt: skip
    assert all(h < 0 for h in heads)
    assert close(out[HEAD_KEY], sum(heads) / len(tasks), gross=sum(abs(h) for h in heads) / len(tasks))
    assert set(out) == {"eval/greedy_accuracy", "eval/avg@1", *FORM_KEYS, HEAD_KEY}


def test_shared_head_is_the_references_common_first_sentence(tokenizer):
    decoy = load_task("template_decoy", "eval", 3, seed=0, ops="+-")
    for t in decoy:
        a, op, b = t.prompt.split(".")[0].split()[1:]
        assert shared_head(t) == f"Let me compute {a} {op} {b}."
        head = tokenizer(shared_head(t), add_special_tokens=False)["input_ids"]
        for ref in (*t.forms, *t.decoys):  # the head's tokens are the first tokens of every reference
            assert tokenizer(ref, add_special_tokens=False)["input_ids"][: len(head)] == head
    assert shared_head(load_task("template", "eval", 1, seed=0)[0]) == ""  # one reference: no head
    two = Task("p", "1", "Ab. c d. x", forms=("Ab. c d. x", "Ab. c d! y"))
    assert shared_head(two) == "Ab."  # the common prefix "Ab. c d" ends in a sentence only at "Ab."


def test_single_form_tasks_add_no_form_keys(model_dir):
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = RunConfig(model=str(model_dir), task="template", num_eval=3, eval_k=1, max_new_tokens=2)
    tok = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    out = evaluate(cfg, Accelerator(cpu=True), model, tok, load_tasks(cfg, "eval", 3))
    assert set(out) == {"eval/greedy_accuracy", "eval/avg@1"}


def test_form_stats_hand_worked():
    even = form_stats([math.log(0.2), math.log(0.2)])
    assert even["entropy"] == pytest.approx(math.log(2)) and even["mass"] == pytest.approx(0.4)
    assert even["logodds"] == pytest.approx(0.0)
    st = form_stats([math.log(0.3), math.log(0.1)])  # q = (3/4, 1/4)
    assert st["entropy"] == pytest.approx(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25)))
    assert st["mass"] == pytest.approx(0.4) and st["logodds"] == pytest.approx(math.log(3))
    # collapse onto one form: entropy → 0
    assert form_stats([-1.0, -60.0])["entropy"] < 1e-20


def test_tiny_command_builds_the_task(tmp_path):
    from transformers import AutoTokenizer

    from scaledrun.tiny import main

    main(["--out", str(tmp_path / "m"), "--task", "template_forms", "--warm-start-steps", "0"])
    tok = AutoTokenizer.from_pretrained(tmp_path / "m")
    for t in load_task("template_forms", "eval", 5, seed=0, ops="+-"):
        for f in t.forms:
            assert tok.decode(tok(f, add_special_tokens=False)["input_ids"]) == f


def test_warm_start_stop_callback(tokenizer):
    tasks = load_task("template_forms", "train", 20, seed=0, ops="+")
    calls: list[int] = []

    def stop_at_20(step: int) -> bool:
        calls.append(step)
        return step >= 20

    model = make_model(len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id, seed=0)
    losses = warm_start(model, tokenizer, tasks, steps=35, batch_size=2, stop=stop_at_20, check_every=10)
    assert calls == [10, 20] and len(losses) == 20 and not model.training
    calls.clear()
    never = warm_start(
        model, tokenizer, tasks, steps=30, batch_size=2, stop=lambda s: calls.append(s) or False
    )
    assert calls == [10, 20] and len(never) == 30  # no check after the last step


def test_stop_accuracy_is_checked(tmp_path):
    from scaledrun.tiny import build_tiny

    with pytest.raises(ValueError, match="stop_accuracy"):
        build_tiny(tmp_path, "template_forms", warm_start_steps=0, stop_accuracy=0.4)
    with pytest.raises(ValueError, match="stop_accuracy"):
        build_tiny(tmp_path, "template_forms", warm_start_steps=10, stop_accuracy=1.5)


def test_decoy_task_hand_worked():
    t = TASKS["template_decoy"](37, "+", 45)
    assert t.forms == TASKS["template_forms"](37, "+", 45).forms and t.prompt.startswith("Compute 37 + 45.")
    assert t.decoys == ("Let me compute 37 + 45. Adding the tens of 37 and 45 gives 70. The answer is 70.",)
    assert t.references == t.forms  # a decoy is never a reference
    sub = TASKS["template_decoy"](73, "-", 45)
    assert sub.decoys == (
        "Let me compute 73 - 45. Subtracting the tens of 45 from 73 gives 30. The answer is 30.",
    )
    # the decoy is rewarded only where dropping the units digits does not matter: both units 0 (+), equal (-)
    for a, op, b in [(37, "+", 45), (30, "+", 40), (73, "-", 45), (75, "-", 45), (12, "+", 13)]:
        d = TASKS["template_decoy"](a, op, b)
        want = float(a % 10 == 0 and b % 10 == 0) if op == "+" else float(a % 10 == b % 10)
        assert exact_match([d.prompt], list(d.decoys), [d.answer]) == [want]
        assert exact_match([d.prompt] * 2, list(d.forms), [d.answer] * 2) == [1.0, 1.0]


def test_warm_start_rows_include_decoys():
    tok = train_tokenizer(_tokenizer_corpus("template_decoy", 0))
    tasks = load_task("template_decoy", "train", 12, seed=0, ops="+-")
    _, _, labels = _sft_batch(tok, tasks)
    targets = [tok.decode([i for i in row.tolist() if i != -100]) for row in labels]
    # per problem: both correct forms, then the decoy (a third of the rows are wrong on purpose)
    assert targets == [c + EOS_TOKEN for t in tasks for c in (*t.forms, *t.decoys)]
