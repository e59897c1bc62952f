"""The reward rules side by side with paper A's own code (tests/data/rewards/, docs/rewards.md).

Paper A's verdicts were computed once by running its `compute_reward` outside the project
(tests/data/rewards/README.md gives the commit and the command). Under `paper_a` rules ours must
equal them on every case; under the default rules every difference must be one of the departures
docs/rewards.md documents, in the direction it documents.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from collections import Counter

import pytest
import yaml

from tests.conftest import REPO

os.environ.setdefault("OMP_NUM_THREADS", "1")

from esgrpo.config import ConfigError, check_config  # noqa: E402
from esgrpo.es.settings import ESConfig  # noqa: E402
from esgrpo.evaluation.evaluate import EvalSettings  # noqa: E402
from esgrpo.grpo.settings import GRPOSettings  # noqa: E402
from esgrpo.runs import run_spec  # noqa: E402
from esgrpo.tasks import math_verify_runner as runner  # noqa: E402
from esgrpo.tasks import paper_b_rewards, rewards  # noqa: E402
from esgrpo.tasks.rewards import RULES, grade_math, reward, verifier_for  # noqa: E402

DATA = REPO / "tests" / "data" / "rewards"
DOC = REPO / "docs" / "rewards.md"
PAPER_A_COMMIT = "43eed8c33ae8826dd0128eaa5e75bde6c9be639d"
PAPER_B_COMMIT = "240d87852c3d51bcf5e6c909e7ee78bae5286fe7"

# Every way the default rules' verdict may differ from paper A's on the corpus: id (as docs/rewards.md
# names it) -> (task, (ours, paper A's), the surface forms it covers: a regex over the case's `form`
# without its _leadN suffix). A difference in another form, or in the other direction, fails the test.
DEPARTURES: dict[str, tuple[str, tuple[float, float], str]] = {
    "countdown.answer_tag": ("countdown", (1.0, 0.0), r"answer_tag_only|.*_answer_tag"),
    "countdown.box_reading": ("countdown", (1.0, 0.0), r"box_nested|box_space_before_brace"),
    "countdown.operators": ("countdown", (0.0, 1.0), r"power_operator|floor_division_operator"),
    "math.unboxed": ("math", (1.0, 0.0), r".*no_box.*|fbox|boxed_no_braces"),
    "math.box_reading": ("math", (1.0, 0.0), r"box_space_before_brace|box_then_unclosed"),
    "math.text_wrapper": ("math", (1.0, 0.0), r"box_text_wrapped"),
    "math.equivalence": ("math", (1.0, 0.0), r"eq_.*"),
    "math.python_float": ("math", (0.0, 1.0), r"code_.*|near_base_digits_joined"),
    "math.tolerance": ("math", (0.0, 1.0), r"near_tiny_.*|near_near_decimal"),
    "math.prefix_reading": ("math", (0.0, 1.0), r"near_frac_with_suffix|near_slash_chain"),
    "chemistry.statement_order": ("chemistry", (0.0, 1.0), r"json_then_answer_line_disagree"),
    "chemistry.lower_case": ("chemistry", (0.0, 1.0), r"answer_colon_lower.*|answer_spaced_colon"),
    "chemistry.standalone_letter": ("chemistry", (0.0, 1.0),
                                    r"bare_letter|option_prose|letter_then_article|lower_letter_prose|no_answer"),
    "chemistry.json_word": ("chemistry", (0.0, 1.0), r"json_word_value_.*"),
    "boolq.unboxed": ("boolq", (1.0, 0.0), r"no_box_.*"),
    "boolq.box_reading": ("boolq", (1.0, 0.0),
                          r"box_nested|box_space_before_brace|box_text_.*|box_textbf_wrapped|box_true_text"),
    "boolq.words": ("boolq", (0.0, 1.0), r"box_word\d+_(?:1|0|correct|right|incorrect|wrong)"),
    "boolq.letters_only": ("boolq", (1.0, 0.0), r"box_word\d+_(?:ye_s|n_o)"),
}


@pytest.fixture(scope="module", autouse=True)
def patient_math_verify():
    """math-verify's time limits are wall-clock (SIGALRM, 2 s): on a busy machine a first parse that
    imports parts of sympy can pass them and read as "wrong". The rules, not the machine's load, are
    under test here: give it 60 s, and forget verdicts other tests took under the usual limits."""
    saved = runner._MV_PARSE_TIMEOUT, runner._MV_VERIFY_TIMEOUT, runner._MV_PAPER_B_TIMEOUT
    runner._MV_PARSE_TIMEOUT = runner._MV_VERIFY_TIMEOUT = runner._MV_PAPER_B_TIMEOUT = 60
    for cache in (rewards.grade_math, paper_b_rewards.grade_eval):
        cache.cache_clear()
    yield
    runner._MV_PARSE_TIMEOUT, runner._MV_VERIFY_TIMEOUT, runner._MV_PAPER_B_TIMEOUT = saved
    for cache in (rewards.grade_math, paper_b_rewards.grade_eval):
        cache.cache_clear()


@pytest.fixture(scope="module")
def corpus() -> list[dict]:
    return [json.loads(line) for line in (DATA / "corpus.jsonl").read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def paper_a() -> dict:
    return json.loads((DATA / "paper_a_verdicts.json").read_text(encoding="utf-8"))


def grade(case: dict, rules: str) -> float:
    return float(verifier_for(case["verifier"], rules)(case["completion"], case["answer"], case["meta"]))


def test_the_verdicts_are_paper_a_s_on_this_corpus(corpus, paper_a):
    """Same corpus bytes, the commit configs/paper_a.yaml cites, one verdict per case, >= 300 per task;
    the corpus is what make_corpus.py writes (so it can be rebuilt and re-graded)."""
    raw = (DATA / "corpus.jsonl").read_bytes()
    assert paper_a["corpus_sha256"] == hashlib.sha256(raw).hexdigest(), "re-run paper_a_verdicts.py (README)"
    assert paper_a["commit"] == PAPER_A_COMMIT and PAPER_A_COMMIT in (REPO / "configs" / "paper_a.yaml").read_text()
    assert PAPER_A_COMMIT in paper_a["command"] and "paper_a_verdicts.py" in paper_a["command"]
    assert set(paper_a["verdicts"]) == {c["id"] for c in corpus}
    counts = Counter(c["task"] for c in corpus)
    print(f"\ncorpus: {dict(counts)} ({len(corpus)} cases)")
    assert set(counts) == {"countdown", "math", "chemistry", "boolq"} and min(counts.values()) >= 300
    sys.path.insert(0, str(DATA))
    try:
        import make_corpus
    finally:
        sys.path.remove(str(DATA))
    rebuilt = "".join(json.dumps(c, ensure_ascii=False, sort_keys=True) + "\n" for c in make_corpus.build())
    assert rebuilt.encode("utf-8") == raw


def test_paper_a_rules_equal_paper_a_s_code_on_every_case(corpus, paper_a):
    wrong = [(c["id"], c["form"], grade(c, "paper_a"), paper_a["verdicts"][c["id"]]) for c in corpus
             if grade(c, "paper_a") != paper_a["verdicts"][c["id"]]]
    rewarded = Counter(c["task"] for c in corpus if paper_a["verdicts"][c["id"]] > 0)
    print(f"\npaper_a rules = paper A's code on {len(corpus) - len(wrong)}/{len(corpus)} cases; "
          f"rewarded per task {dict(rewarded)}")
    assert wrong == []


def _departure_of(case: dict, ours: float, theirs: float) -> str | None:
    form = re.sub(r"_lead\d+$", "", case["form"])
    for name, (task, direction, forms) in DEPARTURES.items():
        if task == case["task"] and direction == (ours, theirs) and re.fullmatch(forms, form):
            return name
    return None


def assert_documented(differences: list[tuple[str | None, tuple]], departures: dict) -> Counter:
    """Every difference (departure name or None, what differed) is a documented departure; every
    departure still shows on some case and is named in docs/rewards.md. The count per departure."""
    seen = Counter(name for name, _ in differences)
    assert [what for name, what in differences if name is None] == []
    assert set(seen) == set(departures), f"departures no case shows any more: {set(departures) - set(seen)}"
    doc = DOC.read_text(encoding="utf-8")
    assert [name for name in departures if f"`{name}`" not in doc] == []
    return seen


def test_every_difference_of_the_default_rules_is_a_documented_departure(corpus, paper_a):
    differences = []
    for case in corpus:
        ours, theirs = grade(case, "esgrpo"), paper_a["verdicts"][case["id"]]
        if ours != theirs:
            differences.append((_departure_of(case, ours, theirs),
                                (case["id"], case["form"], ours, theirs, case["completion"][-60:])))
    differing = Counter(what[0].split("-")[0] for _, what in differences)
    seen = assert_documented(differences, DEPARTURES)
    print(f"\ndefault rules differ from paper A's on {len(differences)} of {len(corpus)} cases "
          f"{dict(differing)}, all in {len(seen)} documented departures: {dict(seen)}")


# --------------------------------------------------------------------------- the default rules' fixes


@pytest.mark.parametrize(("completion", "gold", "ours", "math_verify_alone"), [
    ("\\boxed{1011}", "1011_2", False, True),        # math-verify drops the base
    ("\\boxed{1011_3}", "1011_2", False, True),
    ("\\boxed{1011_{2}}", "1011_2", True, True),
    ("\\boxed{1011_\\text{2}}", "1011_2", True, False),
    ("\\boxed{\\text{1011_2}}", "1011_2", True, False),
    ("\\boxed{11}", "1011_2", False, False),
    ("\\boxed{1011_2}", "1011", False, True),
    ("\\boxed{2516_8}", "2516_{8}", True, True),
    ("The answer is 1011_2.", "1011_2", True, True),
    ("The answer is 1011.", "1011_2", False, True),
    ("\\boxed{90\\circ}", "90^\\circ", True, False),  # math-verify reads it only after a space
    ("\\boxed{ 90\\circ }", "90^\\circ", True, True),
    ("\\boxed{90°}", "90", True, False),
    ("\\boxed{90^{\\circ}}", "90^\\circ", True, True),
    ("\\boxed{f \\circ g}", "f \\circ g", True, True),  # composition keeps its \circ
    ("\\boxed{1 000}", "1000", True, False),        # 1*000 to math-verify
    ("\\boxed{12 34}", "1234", False, False),       # not thousands groups
    ("\\boxed{\\text{3\\sqrt{2}}}", "3\\sqrt{2}", True, False),
    ("\\boxed{\\text{(1,2)}}", "(1,2)", True, False),
    ("\\boxed{\\text{Evelyn}}", "\\text{Evelyn}", True, True),
])
def test_the_default_rules_fix_math_verify_s_misreadings(completion, gold, ours, math_verify_alone):
    """Each fix (docs/rewards.md, "Fixed") against math-verify's own verdict on the same box: the
    cases where they differ are the misreadings; if math-verify changes, this shows which."""
    assert grade_math(completion, gold) is ours
    box = rewards.last_boxed(completion)
    alone = runner.check_main_thread(completion if box is None else f"\\boxed{{{box}}}", gold)
    assert alone is math_verify_alone


def test_a_gold_math_verify_could_not_parse_is_parsed_again_next_time():
    """math-verify returns [] for a time-out as for an unparseable text: only parses that succeeded
    are remembered, so one slow first parse does not make that gold's every later answer wrong."""
    assert runner.parse_gold("\\frac{14}{3}") and "\\frac{14}{3}" in runner._GOLD_PARSES
    assert runner.parse_gold("\\text{}") == () and "\\text{}" not in runner._GOLD_PARSES


def test_the_fixes_leave_plain_numbers_and_the_fast_path_alone():
    for completion, gold in [("\\boxed{72}", "72"), ("#### 72", "72"), ("\\boxed{1,000}", "1000"),
                             ("\\boxed{\\frac{1}{2}}", "0.5"), ("\\boxed{x_1}", "x_1")]:
        assert grade_math(completion, gold)
    assert not grade_math("\\boxed{12}", "1_2")  # not a base (digit 2 in base 2): math-verify decides


# --------------------------------------------------------------------------- paper B's code

# Every way the default rules' verdict may differ from paper B's code on its corpus: id (as docs/rewards.md
# names it) -> (grader: "eval" its is_gsm8k_correct, "train" its score_training_response; the allowed
# (ours, paper B's) pairs; the surface forms (regex over `form`, _leadN dropped); whose golds: "symbolic"
# (not a plain decimal number), "numeric" or "any"). A difference outside them fails the test.
DEPARTURES_B: dict[str, tuple[str, set[tuple[float, float]], str, str]] = {
    "b.eval.symbolic_gold": ("eval", {(1.0, 0.0), (0.0, 1.0)}, r".*", "symbolic"),
    "b.eval.two_boxes": ("eval", {(1.0, 0.0)},
                         r"box_other_then_this_right|box_this_then_other_wrong|box_repeated_wrong_then_right", "numeric"),
    "b.eval.box_space": ("eval", {(1.0, 0.0)}, r"box_space_before_brace_right", "numeric"),
    "b.eval.text_wrapper": ("eval", {(1.0, 0.0)}, r"box_text_right|box_textbf_right|box_text_wrapped", "numeric"),
    "b.eval.trailing_dot": ("eval", {(1.0, 0.0)}, r"box_trailing_dot_right|eq_trailing_period", "numeric"),
    "b.eval.text_after_answer": ("eval", {(1.0, 0.0)}, r"hashes_then_text_other_right", "numeric"),
    "b.eval.bold": ("eval", {(1.0, 0.0)}, r"tail_bold_right", "numeric"),
    "b.eval.digit_groups": ("eval", {(1.0, 0.0)}, r"eq_space_digits|eq_thousands_thin_space", "numeric"),
    "b.eval.degree_marks": ("eval", {(1.0, 0.0)}, r"eq_circ_no_caret|eq_circ_no_caret_spaced|eq_degree_sign", "numeric"),
    "b.eval.short_fraction": ("eval", {(1.0, 0.0)}, r"eq_frac_short", "numeric"),
    "b.eval.escaped_dollar": ("eval", {(1.0, 0.0)}, r"eq_dollar_sign_no_box", "numeric"),
    "b.train.equal_value": ("train", {(1.0, 0.1)}, r".*", "any"),
    "b.train.percent": ("train", {(0.1, 1.0)}, r"box_percent_right", "any"),
    "b.train.unclosed_last_box": ("train", {(1.0, 0.0), (0.1, 0.0)}, r"box_then_unclosed.*", "any"),
}


@pytest.fixture(scope="module")
def corpus_b() -> list[dict]:
    """Paper B's corpus: the GSM8K cases and the maths cases of the paper A corpus (the hard setting)."""
    cases = [json.loads(line) for name in ("corpus_gsm8k.jsonl", "corpus.jsonl")
             for line in (DATA / name).read_text(encoding="utf-8").splitlines()]
    return [c for c in cases if c["verifier"] == "math"]


@pytest.fixture(scope="module")
def paper_b() -> dict:
    return json.loads((DATA / "paper_b_verdicts.json").read_text(encoding="utf-8"))


def grade_b(case: dict, grader: str, rules: str) -> float:
    """The training reward (boxed_partial, paper B's 1 / 0.1 / 0) or the evaluation verdict under `rules`."""
    if grader == "train":
        return reward("math", case["completion"], case["answer"], case["meta"], "boxed_partial", rules=rules)
    return float(verifier_for("math", rules)(case["completion"], case["answer"], case["meta"]))


def _verdict_b(paper_b: dict, case: dict, grader: str) -> float:
    return float(paper_b["verdicts"][case["id"]][grader])


def test_the_verdicts_are_paper_b_s_on_its_corpus(corpus_b, paper_b):
    """Same corpus bytes, the commit configs/paper_b.yaml cites, both verdicts per case, >= 300 cases per
    grader; corpus_gsm8k.jsonl is what make_corpus_gsm8k.py writes."""
    for name in ("corpus_gsm8k.jsonl", "corpus.jsonl"):
        digest = hashlib.sha256((DATA / name).read_bytes()).hexdigest()
        assert paper_b["corpus_sha256"][name] == digest, "re-run paper_b_verdicts.py (README)"
    assert paper_b["commit"] == PAPER_B_COMMIT and PAPER_B_COMMIT in (REPO / "configs" / "paper_b.yaml").read_text()
    assert PAPER_B_COMMIT in paper_b["command"] and "paper_b_verdicts.py" in paper_b["command"]
    assert paper_b["packages"]["math-verify"] == "0.9.0"  # paper B's pin (its pyproject.toml), and ours
    assert set(paper_b["verdicts"]) == {c["id"] for c in corpus_b}
    assert all(set(v) == {"train", "eval"} for v in paper_b["verdicts"].values())
    assert Counter(c["task"] for c in corpus_b)["gsm8k"] >= 300
    sys.path.insert(0, str(DATA))
    try:
        import make_corpus_gsm8k
    finally:
        sys.path.remove(str(DATA))
    rebuilt = "".join(json.dumps(c, ensure_ascii=False, sort_keys=True) + "\n" for c in make_corpus_gsm8k.cases())
    assert rebuilt.encode("utf-8") == (DATA / "corpus_gsm8k.jsonl").read_bytes()


def test_paper_b_rules_equal_paper_b_s_code_on_every_case(corpus_b, paper_b):
    """Under `paper_b`, training rewards are score_training_response's and evaluation verdicts
    is_gsm8k_correct's on every case."""
    wrong, classes = [], Counter()
    for case in corpus_b:
        for grader in ("train", "eval"):
            ours, theirs = grade_b(case, grader, "paper_b"), _verdict_b(paper_b, case, grader)
            classes[(grader, case["task"], theirs)] += 1
            if ours != theirs:
                wrong.append((case["id"], grader, case["form"], ours, theirs))
    print(f"\npaper_b rules = paper B's code on {len(corpus_b)} cases x 2 graders, "
          f"{len(wrong)} disagreements; (grader, task, paper B's value): cases {dict(sorted(classes.items()))}")
    assert wrong == []


def _departure_b(case: dict, grader: str, ours: float, theirs: float) -> str | None:
    form = re.sub(r"_lead\d+$", "", case["form"])
    symbolic = re.fullmatch(r"-?\d+(?:\.\d+)?", case["answer"]) is None
    for name, (which, directions, forms, golds) in DEPARTURES_B.items():
        if (which == grader and (ours, theirs) in directions and re.fullmatch(forms, form)
                and golds in ("any", "symbolic" if symbolic else "numeric")):
            return name
    return None


def test_every_difference_of_the_default_rules_from_paper_b_is_a_documented_departure(corpus_b, paper_b):
    differences = []
    for case in corpus_b:
        for grader in ("train", "eval"):
            ours, theirs = grade_b(case, grader, "esgrpo"), _verdict_b(paper_b, case, grader)
            if ours != theirs:
                differences.append((_departure_b(case, grader, ours, theirs),
                                    (case["id"], grader, case["form"], ours, theirs, case["completion"][-50:])))
    seen = assert_documented(differences, DEPARTURES_B)
    print(f"\ndefault rules differ from paper B's code in {len(differences)} grades of {2 * len(corpus_b)}, "
          f"all in {len(seen)} documented departures: {dict(seen)}")


def test_paper_b_s_two_graders_reach_training_and_evaluation():
    """Training (`reward`) gets score_training_response's 1 / 0.1 / 0, evaluation (`verifier_for`)
    is_gsm8k_correct's verdict; other kinds keep the project's graders (paper B grades maths only)."""
    texts = ["\\boxed{72}", "\\boxed{72.00}", "\\boxed{73}", "#### 72", "\\boxed{72} and \\boxed{7"]
    assert [reward("math", t, "72", scheme="boxed_partial", rules="paper_b") for t in texts] == [1.0, 0.1, 0.1, 0.0, 0.0]
    assert [verifier_for("math", "paper_b")(t, "72", {}) for t in texts] == [True, True, False, True, True]
    assert reward("math", "\\boxed{72.00}", "72", scheme="boxed_partial") == 1.0  # the default: by value
    assert verifier_for("yesno", "paper_b") is verifier_for("yesno", "esgrpo")


def test_paper_b_s_math_verify_step_gives_the_same_answer_outside_the_main_thread():
    """Rollout pools grade in threads: the helper process answers paper B's step as the main thread
    does, "nothing parsed" included (then the regular expressions decide)."""
    import threading

    texts = [("so \\boxed{16}", "16"), ("so \\boxed{17}", "16"), ("no number here", "16")]
    here = [runner.paper_b_verdict(t, g) for t, g in texts]
    there: list = []
    thread = threading.Thread(target=lambda: there.extend(runner.paper_b_verdict(t, g) for t, g in texts))
    thread.start()
    thread.join()
    assert here == there == [True, False, None]


# --------------------------------------------------------------------------- the rules reach every job


def test_every_grader_takes_the_rules_and_refuses_unknown_ones():
    for settings in (ESConfig.from_dict({"reward_rules": "paper_a"}),
                     GRPOSettings.from_dict({"reward_rules": "paper_a"}), EvalSettings(reward_rules="paper_a")):
        assert settings.reward_rules == "paper_a"
    with pytest.raises(ValueError, match="reward_rules"):
        ESConfig.from_dict({"reward_rules": "paper_c"})
    with pytest.raises(ValueError, match="reward_rules"):
        GRPOSettings.from_dict({"reward_rules": "paper_c"})
    with pytest.raises(ValueError, match="eval.reward_rules.*allowed"):
        EvalSettings(reward_rules="paper_c")
    with pytest.raises(ValueError, match="allowed"):
        reward("yesno", "\\boxed{yes}", "yes", rules="paper_c")
    assert set(RULES) == {"esgrpo", "paper_a", "paper_b"}


def test_grpo_s_reward_function_grades_under_the_rules():
    pytest.importorskip("trl")
    from esgrpo.grpo.trainer import make_reward_function

    completions, answers = ["\\boxed{1}", "The answer is yes"], ["yes", "yes"]
    assert make_reward_function("yesno")(completions, answers) == [0.0, 1.0]
    assert make_reward_function("yesno", rules="paper_a")(completions, answers) == [1.0, 0.0]


@pytest.mark.parametrize(("name", "rules"), [("paper_a", "paper_a"), ("paper_b", "paper_b")])
def test_the_paper_configs_train_with_their_paper_s_rules(name, rules):
    config = yaml.safe_load((REPO / "configs" / f"{name}.yaml").read_text())
    assert config["rewards"]["rules"] == rules
    model = next(iter(config["models"]))
    for task in config["models"][model]["tasks"]:
        for run in ("es-n30-s0", "grpo-g8-s0") if name == "paper_a" else ("es-n32-s0", "grpo-g8-s0"):
            assert run_spec(config, model, task, run).settings["reward_rules"] == rules


def test_one_key_sets_the_rules():
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    check_config(config)
    assert "reward_rules" not in run_spec(config, "tiny", "countdown3", "es-n16-s0").settings  # the default's own
    config["es"]["settings"]["reward_rules"] = "paper_a"
    with pytest.raises(ConfigError, match=r"es\.settings\.reward_rules: .*rewards\.rules"):
        check_config(config)


def test_the_verifiers_paper_rules_leave_to_the_projects_graders_are_named():
    """Paper B grades maths only; paper A's code grades the four kinds it has. Any other verifier (a task
    added since) is graded by the project's own grader, which the workflow's Reward rules line names."""
    from esgrpo.tasks.rewards import VERIFIERS, own_graders_under, verifier_for

    assert own_graders_under("esgrpo", VERIFIERS) == []
    assert own_graders_under("paper_a", [*VERIFIERS, "exact"]) == ["exact"]
    assert own_graders_under("paper_b", VERIFIERS) == ["choice", "countdown", "yesno"]
    assert verifier_for("yesno", "paper_b") is VERIFIERS["yesno"]


def test_evaluation_grades_under_its_settings_rules_and_records_them():
    pytest.importorskip("transformers")
    from esgrpo.engines.rollout import HFEngine
    from esgrpo.evaluation.evaluate import evaluate_rows
    from esgrpo.models.default import TinyLlamaSpec, build_tiny_llama, train_tokenizer
    from esgrpo.tasks.offline import load_sum_yesno, worked_solution

    rows = load_sum_yesno("train", 6, 0)
    tokenizer = train_tokenizer([r["prompt"][-1]["content"] + " " + worked_solution(r) for r in rows], 300)
    model = build_tiny_llama(tokenizer, TinyLlamaSpec(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                      num_attention_heads=2, num_key_value_heads=1), seed=0)
    engine = HFEngine(model.eval(), tokenizer)
    for rules in RULES:
        summary, per_prompt = evaluate_rows(engine, rows, "yesno",
                                            EvalSettings(n_samples=1, ks=[1], max_new_tokens=8, reward_rules=rules))
        assert summary["settings"]["reward_rules"] == rules
        grade_yesno = verifier_for("yesno", rules)
        for row, record in zip(rows, per_prompt, strict=True):
            assert record["greedy_correct"] == grade_yesno(record["greedy_completion"], row["answer"], row["meta"])
            assert record["correct"] == grade_yesno(record["sample_completion"], row["answer"], row["meta"])
