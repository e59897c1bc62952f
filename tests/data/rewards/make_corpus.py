"""Write corpus.jsonl: completions in many surface forms, for grading by our rules and by paper A's code.

Run from the repository root:  python tests/data/rewards/make_corpus.py
Deterministic (no clock, a fixed seed); re-running rewrites the same bytes. Each line is one case:
  {"id", "task", "verifier", "form", "completion", "answer", "meta"}
`answer` and `meta` are what the project's task rows hold (esgrpo.tasks.hub): countdown's answer is the
target as text and its meta holds numbers and target; math's answer is the gold string; chemistry's the
gold letter; boolq's "yes" / "no". `form` names the surface form, so a disagreement between two sets of
rules can be traced to the form that caused it (tests/tasks/test_paper_rewards.py, docs/rewards.md).

The cases are written by hand here (no model output): correct answers in many surface forms and near
misses (boxes nested, spaced, repeated, changed; fractions, decimals, units, thousands separators,
unicode minus, base subscripts, degrees; options in JSON, prose, lower case; yes/no words; countdown
expressions with numbers reused or missing and other operators; <answer> tags).
"""

from __future__ import annotations

import json
import random
import re
import sys
from collections.abc import Callable, Iterator
from fractions import Fraction
from pathlib import Path

OUT = Path(__file__).with_name("corpus.jsonl")
SEED = 20260421

Case = tuple[str, str]  # (form, completion)

# ----------------------------------------------------------------------------------------------
# Countdown: problems built from a known expression, so a right answer is known for each.

COUNTDOWN_PROBLEMS: list[tuple[list[int], int, str]] = [
    ([44, 19, 35], 98, "44 + 19 + 35"),
    ([63, 95, 96], 64, "96 - 95 + 63"),
    ([95, 11, 56], 28, "95 - 56 - 11"),
    ([19, 74, 45], 48, "74 - 45 + 19"),
    ([2, 3, 7], 42, "2 * 3 * 7"),
    ([8, 4, 6], 12, "8 / 4 * 6"),
    ([12, 3, 5, 2], 22, "12 / 3 * 5 + 2"),
    ([9, 6, 4, 1], 59, "9 * 6 + 4 + 1"),
    ([25, 50, 75, 100], 51, "(100 - 75) / 25 + 50"),
    ([7, 3, 5, 10], 50, "(7 + 3) * (10 - 5)"),
    ([6, 5, 3], 7, "6 / 3 + 5"),
    ([15, 4, 9, 3], 36, "15 + 4 * 3 + 9"),
    ([5, 5, 3], 13, "5 + 5 + 3"),
    ([8, 8, 2, 4], 4, "(8 + 8) / 2 - 4"),
]


def _countdown_problems() -> list[tuple[list[int], int, str]]:
    """The problems above (each checked: no hand error slips in), plus seeded random ones."""
    rng = random.Random(SEED)
    good = []
    for numbers, target, expr in COUNTDOWN_PROBLEMS:
        if not (_uses_exactly(expr, numbers) and _value(expr) == target):
            raise ValueError(f"hand-written countdown problem is wrong: {numbers} {target} {expr}")
        good.append((numbers, target, expr))
    while len(good) < 16:
        k = rng.choice([3, 4])
        numbers = [rng.randint(1, 99) for _ in range(k)]
        ops = [rng.choice("+-*") for _ in range(k - 1)]
        expr = str(numbers[0])
        for op, n in zip(ops, numbers[1:], strict=True):
            expr = f"({expr}) {op} {n}" if op == "*" and rng.random() < 0.5 else f"{expr} {op} {n}"
        value = _value(expr)
        if value.denominator == 1 and 1 <= value <= 999:
            good.append((numbers, int(value), expr))
    return good


def _value(expr: str) -> Fraction:
    # Our own exact evaluation of a generated expression of + - * / and parentheses (trusted input).
    import ast

    def walk(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant):
            return Fraction(node.value)
        if isinstance(node, ast.BinOp):
            a, b = walk(node.left), walk(node.right)
            ops = {ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b}
            return ops[type(node.op)] if type(node.op) in ops else a / b
        raise ValueError(expr)

    return walk(ast.parse(expr, mode="eval"))


def _uses_exactly(expr: str, numbers: list[int]) -> bool:
    return sorted(int(t) for t in re.findall(r"\d+", expr)) == sorted(numbers)


def countdown_forms(numbers: list[int], target: int, expr: str) -> Iterator[Case]:
    tight = expr.replace(" ", "")
    first, second = numbers[0], numbers[1]
    missing = " + ".join(str(n) for n in numbers[:-1])
    think = f"<think>\nI try combinations of {numbers} to reach {target}.\n</think>\n"
    lead = f"We need {target} from {numbers}. Trying a few combinations.\n"
    yield "box", lead + f"So the answer is \\boxed{{{expr}}}."
    yield "box_tight", lead + f"\\boxed{{{tight}}}"
    yield "box_inner_spaces", lead + f"\\boxed{{  {expr}  }}"
    yield "box_space_before_brace", lead + f"\\boxed {{{expr}}}"
    yield "box_in_dollars", lead + f"$\\boxed{{{expr}}}$"
    yield "box_display_math", lead + f"\\[\n\\boxed{{{expr}}}\n\\]"
    yield "box_with_equals_target", lead + f"\\boxed{{{expr} = {target}}}"
    yield "box_then_equals_outside", lead + f"\\boxed{{{expr}}} = {target}"
    yield "box_extra_parens", lead + f"\\boxed{{(({expr}))}}"
    yield "box_nested", lead + f"\\boxed{{\\boxed{{{expr}}}}}"
    yield "box_text_wrapped", lead + f"\\boxed{{\\text{{{expr}}}}}"
    yield "box_left_right", lead + f"\\boxed{{\\left({expr}\\right)}}"
    yield "box_repeated_wrong_then_right", lead + f"First \\boxed{{{missing}}}, no: \\boxed{{{expr}}}"
    yield "box_repeated_right_then_wrong", lead + f"First \\boxed{{{expr}}}, then \\boxed{{{missing}}}"
    yield "box_empty", lead + "\\boxed{}"
    yield "box_unclosed", lead + f"\\boxed{{{expr}"
    yield "box_newline_inside", lead + f"\\boxed{{{expr.replace(' + ', chr(10) + '+ ', 1)}}}"
    yield "box_tab_inside", lead + f"\\boxed{{{expr.replace(' ', chr(9), 1)}}}"
    yield "answer_tag_only", think + f"<answer>{expr}</answer>"
    yield "answer_tag_and_box_agree", think + f"<answer>{expr}</answer> \\boxed{{{expr}}}"
    yield "answer_tag_right_box_wrong", think + f"<answer>{expr}</answer> \\boxed{{{missing}}}"
    yield "answer_tag_wrong_box_right", think + f"<answer>{missing}</answer> \\boxed{{{expr}}}"
    yield "plain_final_line", lead + f"Answer: {expr}"
    yield "times_latex", lead + f"\\boxed{{{expr.replace('*', chr(92) + 'times')}}}"
    yield "times_unicode", lead + f"\\boxed{{{expr.replace('*', chr(215))}}}"
    yield "cdot_latex", lead + f"\\boxed{{{expr.replace('*', chr(92) + 'cdot')}}}"
    yield "div_latex", lead + f"\\boxed{{{expr.replace('/', chr(92) + 'div')}}}"
    yield "div_unicode", lead + f"\\boxed{{{expr.replace('/', chr(247))}}}"
    yield "minus_unicode", lead + f"\\boxed{{{expr.replace('-', chr(8722))}}}"
    yield "number_reused", lead + f"\\boxed{{{expr} + {first} - {first}}}"
    yield "number_missing", lead + f"\\boxed{{{missing}}}"
    yield "number_extra", lead + f"\\boxed{{{expr} + 0}}"
    yield "numbers_reordered_wrong_value", lead + f"\\boxed{{{' - '.join(str(n) for n in numbers)}}}"
    yield "number_as_decimal", lead + f"\\boxed{{{expr.replace(str(first), f'{first}.0', 1)}}}"
    yield "number_leading_zero", lead + f"\\boxed{{{expr.replace(str(first), f'0{first}', 1)}}}"
    yield "number_double_zero_added", lead + f"\\boxed{{{expr} + 00}}"
    yield "brackets", lead + f"\\boxed{{[{expr}]}}"
    yield "implicit_product", lead + f"\\boxed{{({first})({second})}}"
    yield "frac_latex", lead + f"\\boxed{{\\frac{{{first}}}{{{second}}}}}"
    yield "division_by_zero", lead + f"\\boxed{{{expr} + {first} / ({second} - {second})}}"
    yield "unary_minus_lead", lead + f"\\boxed{{-({expr}) + 2 * ({expr})}}"
    yield "power_in_expression", lead + f"\\boxed{{({expr}) ** 1}}"
    yield "floor_division", lead + f"\\boxed{{({expr}) // 1}}"
    yield "modulo", lead + f"\\boxed{{({expr}) % 1000}}"


# Problems where another Python operator reaches the target with each number once: paper A's eval
# accepts ** and // (both written with allowed characters), which its prompt does not list.
COUNTDOWN_OPERATOR_CASES: list[tuple[list[int], int, str, str]] = [
    ([2, 3, 1], 8, "2 ** 3 * 1", "power_operator"),
    ([3, 2, 5], 14, "3 ** 2 + 5", "power_operator"),
    ([2, 5, 7], 39, "2 ** 5 + 7", "power_operator"),
    ([7, 2, 1], 3, "7 // 2 * 1", "floor_division_operator"),
    ([20, 3, 4], 10, "20 // 3 + 4", "floor_division_operator"),
    ([9, 4, 10], 12, "9 // 4 + 10", "floor_division_operator"),
    ([2, 3, 5], 2, "2 ** -3 * 5 + 2 - 2", "power_operator"),  # uses 2 twice: rejected by both
    ([2, 10, 1], 0, "2 ** -10 // 1", "power_operator"),
    ([4, 2, 8], 10, "4 ** (1 / 2) + 8", "power_operator"),
    ([8, 3, 2], 4, "8 ** (1 / 3) * 2", "power_operator"),
    ([6, 3, 2], 4, "6 / 3 * 2", "exact_division"),
    ([7, 3, 3], 9, "7 * 3 / 3 + 2", "exact_division"),
    ([1, 3, 3], 1, "1 / 3 * 3", "float_division_rounding"),
    ([10, 3, 30], 100, "10 / 3 * 30", "float_division_rounding"),
    ([49, 1, 49], 1, "1 / 49 * 49", "float_division_rounding"),
    ([2, 2000, 1], 1, "2 ** 2000 * 1", "power_overflow"),
    ([5, 5, 3], 13, "5 + 3 + 3", "number_reused_duplicate"),
    ([5, 5, 3], 8, "5 + 3", "number_missing_duplicate"),
]


def countdown_cases() -> Iterator[tuple[str, str, str, dict]]:
    for numbers, target, expr in _countdown_problems():
        meta = {"numbers": numbers, "target": target}
        for form, completion in countdown_forms(numbers, target, expr):
            yield form, completion, str(target), meta
    for numbers, target, expr, form in COUNTDOWN_OPERATOR_CASES:
        meta = {"numbers": numbers, "target": target}
        yield form, f"Let me compute.\n\\boxed{{{expr}}}", str(target), meta
        yield form + "_answer_tag", f"<answer>{expr}</answer>", str(target), meta


# ----------------------------------------------------------------------------------------------
# MATH: gold strings of the kinds MATH-500 holds, each with equal forms and near misses.

# (gold, wrong answer, other forms [(form, text)]: equal ones and near misses, MATH_NEAR)
MATH_GOLDS: list[tuple[str, str, list[tuple[str, str]]]] = [
    ("27", "28", [("decimal_trailing_zero", "27.0"), ("decimal_zeros", "27.00"), ("text_wrapped", "\\text{27}"),
                  ("units_text", "27\\text{ cm}"), ("units_plain", "27 cm"), ("x_equals", "x = 27"),
                  ("scientific", "2.7e1"), ("dollar_sign", "\\$27"), ("trailing_period", "27."),
                  ("expression", "3^3"), ("frac_equal", "\\frac{54}{2}")]),
    ("-3", "3", [("minus_unicode", "\u22123"), ("decimal_trailing_zero", "-3.0"), ("paren", "(-3)"),
                 ("frac_equal", "-\\frac{6}{2}"), ("x_equals", "x=-3")]),
    ("0", "1", [("decimal_trailing_zero", "0.0"), ("minus_zero", "-0"), ("text_wrapped", "\\text{0}")]),
    ("1000", "100", [("thousands_comma", "1,000"), ("thousands_brace_comma", "1{,}000"),
                     ("thousands_thin_space", "1\\,000"), ("thousands_neg_space", "1,\\!000"),
                     ("underscore_digits", "1_000"), ("scientific", "1e3"), ("space_digits", "1 000"),
                     ("power", "10^3")]),
    ("10080", "10800", [("thousands_comma", "10,080"), ("thousands_brace_comma", "10{,}080"),
                        ("thousands_thin_space", "10\\,080")]),
    ("0.5", "0.25", [("frac", "\\frac{1}{2}"), ("frac_short", "\\frac12"), ("slash", "1/2"),
                     ("dfrac", "\\dfrac{1}{2}"), ("leading_dot", ".5"), ("decimal_trailing_zero", "0.50"),
                     ("frac_with_suffix", "\\frac{1}{2}x"), ("slash_chain", "1/2/3"),
                     ("percent", "50\\%")]),
    ("\\frac{1}{2}", "\\frac{1}{3}", [("decimal", "0.5"), ("frac_short", "\\frac12"), ("dfrac", "\\dfrac{1}{2}"),
                                      ("tfrac", "\\tfrac{1}{2}"), ("slash", "1/2"), ("frac_spaced", "\\frac{1}{2} "),
                                      ("frac_unreduced", "\\frac{2}{4}"), ("slash_paren", "(1)/(2)")]),
    ("\\frac{14}{3}", "\\frac{3}{14}", [("decimal_rounded", "4.67"), ("decimal_long", "4.666666666666667"),
                                        ("slash", "14/3"), ("mixed_number", "4\\frac{2}{3}"),
                                        ("dfrac", "\\dfrac{14}{3}"), ("frac_unreduced", "\\frac{28}{6}")]),
    ("-\\frac{3}{4}", "\\frac{3}{4}", [("decimal", "-0.75"), ("frac_neg_numerator", "\\frac{-3}{4}"),
                                       ("slash", "-3/4"), ("dfrac", "-\\dfrac{3}{4}"),
                                       ("minus_unicode", "\u2212\\frac{3}{4}")]),
    ("\\dfrac{5}{8}", "\\dfrac{8}{5}", [("frac", "\\frac{5}{8}"), ("decimal", "0.625"), ("slash", "5/8")]),
    ("3\\sqrt{2}", "2\\sqrt{3}", [("sqrt_unreduced", "\\sqrt{18}"), ("spaced", "3 \\sqrt{2}"),
                                  ("times_sqrt", "3 \\cdot \\sqrt{2}"), ("sqrt_short", "3\\sqrt2"),
                                  ("decimal_rounded", "4.2426")]),
    ("\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt{2}}{2}", [("slash", "\\sqrt{3}/2"), ("dfrac", "\\dfrac{\\sqrt{3}}{2}"),
                                                      ("decimal_rounded", "0.866")]),
    ("2\\pi", "\\pi", [("spaced", "2 \\pi"), ("pi_times", "2\\cdot\\pi"), ("decimal_rounded", "6.28")]),
    ("90^\\circ", "45^\\circ", [("number_only", "90"), ("circ_braced", "90^{\\circ}"), ("circ_no_caret", "90\\circ"),
                                ("circ_no_caret_spaced", " 90\\circ "), ("degree_sign", "90\u00b0"),
                                ("degree_word", "90 degrees"), ("circ_spaced", "90 ^\\circ"),
                                ("text_degrees", "90\\text{ degrees}")]),
    ("90", "45", [("circ", "90^\\circ"), ("circ_braced", "90^{\\circ}"), ("circ_no_caret", "90\\circ"),
                  ("circ_no_caret_spaced", " 90\\circ "), ("degree_sign", "90\u00b0")]),
    ("1011_2", "1101_2", [("base_dropped", "1011"), ("base_braced", "1011_{2}"), ("base_digits_joined", "10112"),
                          ("base_decimal_value", "11"), ("base_text", "1011_\\text{2}")]),
    ("2516_8", "2561_8", [("base_dropped", "2516"), ("base_braced", "2516_{8}"), ("base_digits_joined", "25168")]),
    ("10\\%", "20\\%", [("percent_plain", "10%"), ("number_only", "10"), ("decimal_fraction", "0.1"),
                        ("percent_spaced", "10 \\%")]),
    ("\\$18.90", "\\$19.80", [("no_dollar", "18.90"), ("trailing_zero_dropped", "18.9"), ("dollar_plain", "$18.90"),
                              ("units_text", "18.90\\text{ dollars}")]),
    ("(1,2)", "(2,1)", [("spaced", "(1, 2)"), ("left_right", "\\left(1,2\\right)"), ("brackets", "[1,2]")]),
    ("x^2+1", "x^2-1", [("spaced", "x^2 + 1"), ("reordered", "1+x^2"), ("braced_exponent", "x^{2}+1"),
                        ("function_form", "f(x)=x^2+1")]),
    ("[-2,3)", "(-2,3]", [("spaced", "[-2, 3)"), ("left_right", "\\left[-2,3\\right)")]),
    ("\\text{(C)}", "\\text{(B)}", [("letter", "C"), ("paren_letter", "(C)"), ("text_letter", "\\text{C}")]),
    ("\\text{Evelyn}", "\\text{Angela}", [("plain_word", "Evelyn"), ("lower_word", "evelyn")]),
    ("5\\sqrt{5}", "5\\sqrt{3}", [("sqrt_unreduced", "\\sqrt{125}"), ("spaced", "5 \\sqrt{5}")]),
    ("3.75", "3.57", [("frac", "\\frac{15}{4}"), ("slash", "15/4"), ("decimal_trailing_zero", "3.750")]),
    ("\\frac{243}{625}", "\\frac{625}{243}", [("decimal", "0.3888"), ("slash", "243/625")]),
    ("1,2,3", "1,2", [("spaced", "1, 2, 3"), ("set", "\\{1,2,3\\}"), ("reordered", "3,2,1")]),
    ("\\infty", "-\\infty", [("word", "infinity"), ("inf", "inf")]),
    ("0", "1", [("tiny_scientific", "1e-7"), ("tiny_decimal", "0.0000001"), ("small_decimal", "0.001")]),
    ("250", "25", [("near_decimal", "250.0000001"), ("nan", "nan"), ("text_number", "\\text{250 apples}")]),
]

# Which listed forms are not equal to the gold (near misses) or equal in programming notation only;
# every other listed form is an equal answer in mathematical notation.
MATH_NEAR = {"decimal_rounded", "decimal_long", "slash_chain", "frac_with_suffix", "base_dropped",
             "base_digits_joined", "base_decimal_value", "tiny_scientific", "tiny_decimal", "small_decimal",
             "near_decimal", "nan", "brackets"}
MATH_CODE = {"scientific", "underscore_digits"}


def _math_kind(form: str) -> str:
    return "near" if form in MATH_NEAR else "code" if form in MATH_CODE else "eq"


MATH_LEADS = [
    "Let me work through this carefully.\n",
    "First compute 12 + 7 = 19, then 19 * 2 = 38, and subtract 11.\n",
]


def math_forms(gold: str, wrong: str, listed: list[tuple[str, str]]) -> Iterator[Case]:
    for i, lead in enumerate(MATH_LEADS):
        tag = f"_lead{i}"
        yield "box_gold" + tag, lead + f"The final answer is \\boxed{{{gold}}}."
        yield "box_wrong" + tag, lead + f"The final answer is \\boxed{{{wrong}}}."
        yield "no_box_answer_is" + tag, lead + f"The answer is {gold}."
        yield "no_box_hashes" + tag, lead + f"#### {gold}"
    yield "box_inner_spaces", f"\\boxed{{ {gold} }}"
    yield "box_space_before_brace", f"\\boxed {{{gold}}}"
    yield "box_in_dollars", f"So $\\boxed{{{gold}}}$"
    yield "box_nested", f"\\boxed{{\\boxed{{{gold}}}}}"
    yield "box_repeated_wrong_then_right", f"\\boxed{{{wrong}}} is wrong; correct: \\boxed{{{gold}}}"
    yield "box_repeated_right_then_wrong", f"\\boxed{{{gold}}} hmm, maybe \\boxed{{{wrong}}}"
    yield "box_then_unclosed", f"\\boxed{{{gold}}} and finally \\boxed{{{wrong}"
    yield "box_empty_after", f"\\boxed{{{gold}}} \\boxed{{}}"
    yield "box_empty", "\\boxed{}"
    yield "box_text_wrapped", f"\\boxed{{\\text{{{gold}}}}}"
    yield "fbox", f"\\fbox{{{gold}}}"
    yield "boxed_no_braces", f"\\boxed {gold}" if " " not in gold and "{" not in gold else f"\\boxed{gold}"
    yield "no_box_final_answer", f"Final answer: {gold}"
    yield "no_box_wrong_stated", f"The answer is {wrong}."
    for form, text in listed:
        name = f"{_math_kind(form)}_{form}"
        yield name, f"Therefore the answer is \\boxed{{{text}}}."
        yield name + "_no_box", f"Therefore the answer is {text}."


def math_cases() -> Iterator[tuple[str, str, str, dict]]:
    for gold, wrong, listed in MATH_GOLDS:
        for form, completion in math_forms(gold, wrong, listed):
            yield form, completion, gold, {}


# ----------------------------------------------------------------------------------------------
# Chemistry: four options A-D; the JSON answer field the prompt asks for, and everything else.

CHEM_LEADS = [
    "Let me reason step by step about the reaction.\n",
    "This is a classic redox question; a strong oxidant is needed.\n",
    "Option B is tempting, but (D) ignores the solvent.\n",
]


def chemistry_forms(gold: str, wrong: str) -> Iterator[Case]:
    lo, wlo = gold.lower(), wrong.lower()
    for i, lead in enumerate(CHEM_LEADS):
        t = f"_lead{i}"
        yield "json" + t, lead + f'{{"answer": "{gold}"}}'
        yield "json_wrong" + t, lead + f'{{"answer": "{wrong}"}}'
        yield "json_lower" + t, lead + f'{{"answer": "{lo}"}}'
        yield "answer_colon" + t, lead + f"Answer: {gold}"
        yield "answer_colon_lower" + t, lead + f"Answer: {lo}"
        yield "answer_is_prose" + t, lead + f"The answer is {gold}."
        yield "no_answer" + t, lead + "I cannot decide."
    yield "json_no_space", f'{{"answer":"{gold}"}}'
    yield "json_capital_key", f'{{"Answer": "{gold}"}}'
    yield "json_single_quotes", f"{{'answer': '{gold}'}}"
    yield "json_unquoted_value", f'{{"answer": {gold}}}'
    yield "json_paren_value", f'{{"answer": "({gold})"}}'
    yield "json_letter_and_text", f'{{"answer": "{gold}) the second option"}}'
    yield "json_word_value_acetone", '{"answer": "acetone"}'
    yield "json_word_value_benzene", '{"answer": "benzene"}'
    yield "json_word_value_chlorine", '{"answer": "chlorine"}'
    yield "json_word_value_dilute", '{"answer": "dilute acid"}'
    yield "json_out_of_range", '{"answer": "E"}'
    yield "json_in_code_block", f'```json\n{{"answer": "{gold}"}}\n```'
    yield "json_with_explanation", f'{{"answer": "{gold}", "explanation": "it is a base"}}'
    yield "json_then_answer_line_disagree", f'{{"answer": "{gold}"}}\nAnswer: {wrong}'
    yield "answer_line_then_json_disagree", f'Answer: {wrong}\n{{"answer": "{gold}"}}'
    yield "json_twice_last_right", f'{{"answer": "{wrong}"}} ... corrected: {{"answer": "{gold}"}}'
    yield "json_twice_last_wrong", f'{{"answer": "{gold}"}} ... corrected: {{"answer": "{wrong}"}}'
    yield "json_then_prose_letter", f'{{"answer": "{gold}"}} because {wrong} is unstable'
    yield "answer_colon_paren", f"Answer: ({gold})"
    yield "answer_colon_bold", f"**Answer: {gold}**"
    yield "answer_bold_colon", f"**Answer:** {gold}"
    yield "answer_colon_word", f"Answer: {wlo}cetone"  # a word that starts with a letter a-d
    yield "boxed_letter", f"\\boxed{{{gold}}}"
    yield "boxed_text_letter", f"\\boxed{{\\text{{{gold}}}}}"
    yield "option_prose", f"The correct option is {gold}."
    yield "paren_prose", f"So ({gold}) is correct."
    yield "letter_then_article", f"{gold} is right, as a test shows."
    yield "lower_letter_prose", f"i pick {lo}"
    yield "final_answer_is_letter_period", f"Final answer: {gold}."
    yield "bare_letter", gold
    yield "answer_colon_no_space", f"Answer:{gold}"
    yield "answer_spaced_colon", f"answer : {lo}"
    yield "answer_colon_period", f"Answer: {gold}."
    yield "answer_colon_formula", f"Answer: {gold}l2 is formed"
    yield "json_two_letters", f'{{"answer": "{gold} or {wrong}"}}'
    yield "answer_is_paren_prose", f"The answer is ({gold})."
    yield "answer_colon_then_article", f"Answer: {gold}, as a test shows."
    yield "answer_colon_lower_then_letter", f"answer: {lo} (not {wrong})"
    yield "answer_colon_upper_key_then_letter", f"ANSWER: {gold} rather than {wrong}"
    yield "empty", ""


def chemistry_cases() -> Iterator[tuple[str, str, str, dict]]:
    labels = ["A", "B", "C", "D"]
    for gold, wrong in [("A", "B"), ("B", "C"), ("C", "D"), ("D", "A"), ("C", "A"), ("B", "D"), ("A", "C")]:
        for form, completion in chemistry_forms(gold, wrong):
            yield form, completion, gold, {"labels": labels}


# ----------------------------------------------------------------------------------------------
# BoolQ: yes / no in and out of boxes, in the words paper A's box reads and others.

BOOLQ_LEADS = [
    "The passage says the law was repealed in 1998.\n",
    "Reading carefully, the answer is yes or no depending on the date.\n",
    "",
    "Based on the passage, no further facts are needed.\n",
    "**Reasoning:** the text gives 3 dates; the answer follows from the last one.\n",
]

BOX_WORDS = {
    True: ["yes", "Yes", "YES", "Yes.", " yes ", "true", "True", "1", "correct", "right", "Yes!", "**Yes**",
           "yes, it is", "Y", "yes\n", "'yes'", "\"Yes\"", "Yes (the law applies)", "ye s"],
    False: ["no", "No", "NO", "No.", " no ", "false", "False", "0", "incorrect", "wrong", "No!", "**No**",
            "no, it is not", "N", "no\n", "'no'", "\"No\"", "No (it was repealed)", "n o"],
}


def _slug(word: str) -> str:
    return "_".join(re.findall(r"[a-z0-9]+", word.lower())) or "punct"


def boolq_forms(gold: bool) -> Iterator[Case]:
    right, wrong = ("yes", "no") if gold else ("no", "yes")
    for i, lead in enumerate(BOOLQ_LEADS):
        t = f"_lead{i}"
        for j, word in enumerate(BOX_WORDS[gold]):
            yield f"box_word{j:02d}_{_slug(word)}" + t, lead + f"\\boxed{{{word}}}"
        for j, word in enumerate(BOX_WORDS[not gold][:6]):
            yield f"box_opposite_word{j:02d}_{_slug(word)}" + t, lead + f"\\boxed{{{word}}}"
        yield "no_box_answer_is" + t, lead + f"The answer is {right}."
        yield "no_box_answer_colon" + t, lead + f"Answer: {right.capitalize()}"
        yield "no_box_wrong_stated" + t, lead + f"The answer is {wrong}."
    cap = right.capitalize()
    yield "box_text_wrapped", f"\\boxed{{\\text{{{cap}}}}}"
    yield "box_textbf_wrapped", f"\\boxed{{\\textbf{{{right}}}}}"
    yield "box_text_in_dollars", f"$\\boxed{{\\text{{{right}}}}}$"
    yield "box_in_dollars", f"$\\boxed{{{right}}}$"
    yield "box_space_before_brace", f"\\boxed {{{right}}}"
    yield "box_nested", f"\\boxed{{\\boxed{{{right}}}}}"
    yield "box_repeated_wrong_then_right", f"\\boxed{{{wrong}}} ... on reflection \\boxed{{{right}}}"
    yield "box_repeated_right_then_wrong", f"\\boxed{{{right}}} ... on reflection \\boxed{{{wrong}}}"
    yield "box_then_unclosed", f"\\boxed{{{right}}} then \\boxed{{{wrong}"
    yield "box_empty", "\\boxed{}"
    yield "box_then_prose_disagree", f"\\boxed{{{right}}}. The answer is {wrong}."
    yield "prose_then_box_disagree", f"The answer is {wrong}. \\boxed{{{right}}}"
    yield "box_other_language", "\\boxed{oui}" if gold else "\\boxed{non}"
    yield "box_true_text", f"\\boxed{{\\text{{{'True' if gold else 'False'}}}}}"
    yield "box_unicode_word", f"\\boxed{{{cap}\u3002}}"


def boolq_cases() -> Iterator[tuple[str, str, str, dict]]:
    for gold in (True, False):
        for form, completion in boolq_forms(gold):
            yield form, completion, "yes" if gold else "no", {}


# ----------------------------------------------------------------------------------------------

TASKS: dict[str, tuple[str, Callable[[], Iterator[tuple[str, str, str, dict]]]]] = {
    "countdown": ("countdown", countdown_cases),
    "math": ("math", math_cases),
    "chemistry": ("choice", chemistry_cases),
    "boolq": ("yesno", boolq_cases),
}


def build() -> list[dict]:
    cases = []
    for task, (verifier, make) in TASKS.items():
        for n, (form, completion, answer, meta) in enumerate(make()):
            cases.append({"id": f"{task}-{n:04d}", "task": task, "verifier": verifier, "form": form,
                          "completion": completion, "answer": answer, "meta": meta})
    return cases


def main() -> int:
    cases = build()
    text = "".join(json.dumps(c, ensure_ascii=False, sort_keys=True) + "\n" for c in cases)
    OUT.write_text(text, encoding="utf-8")
    counts = {t: sum(c["task"] == t for c in cases) for t in TASKS}
    print(f"wrote {OUT} ({len(cases)} cases: {counts})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
