"""Write corpus_gsm8k.jsonl: GSM8K-style completions in many surface forms, for grading by our rules and by
paper B's code.

Run from the repository root:  python tests/data/rewards/make_corpus_gsm8k.py
Deterministic (no clock, no randomness); re-running rewrites the same bytes. Each line is one case:
  {"id", "task": "gsm8k", "verifier": "math", "form", "completion", "answer", "meta": {}}
`answer` is what the project's GSM8K rows hold (esgrpo.tasks.hub.gsm8k_gold: the text after `####`,
thousands commas removed), which is also what paper B's `extract_gold_answer` gives. `form` names the
surface form; `_right` / `_wrong` says whether the written value is the gold's.

The cases are written by hand (no model output): the answer boxed first or last, repeated, unclosed,
spaced; `####`; "the answer is"; numbers with commas, decimals, fractions, units, percent, dollars,
LaTeX commas; unboxed tails; each with the gold's value and with a near miss (another value).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from fractions import Fraction
from pathlib import Path

OUT = Path(__file__).with_name("corpus_gsm8k.jsonl")

# GSM8K golds of the kinds its test split holds: small and large integers, zero, a few decimals.
GOLDS = ["18", "3", "70000", "1080", "0", "5", "460", "1200", "2.5", "0.25", "12", "150", "7", "1000000"]

# Reasoning before the final answer, with numbers of its own (what math-verify may read first).
LEADS = [
    "Janet's ducks lay 16 eggs per day. She eats 3 and bakes with 4, so 16 - 3 - 4 = 9 remain.\n",
    "First, 2 * 3 = 6. Then we add the remaining 4 items.\n",
    "Let me think step by step.\n",
]


def _grouped(value: str) -> str:
    """1000000 -> 1,000,000 (integers only; other values unchanged)."""
    return f"{int(value):,}" if value.lstrip("-").isdigit() else value


def _near_miss(gold: str) -> str:
    """Another value of the gold's kind: integers + 1, decimals + 0.5."""
    value = Fraction(gold)
    wrong = value + (1 if value.denominator == 1 else Fraction(1, 2))
    return str(int(wrong)) if wrong.denominator == 1 else str(float(wrong))


def _as_fraction(value: str) -> str:
    """The value as \\frac{2v}{2} (an unreduced fraction), or \\frac{p}{q} for a decimal."""
    f = Fraction(value)
    return f"\\frac{{{2 * f.numerator}}}{{{2 * f.denominator}}}"


# form -> how a value is written (the lead is prepended). `v` is the written value, `o` another value
# (the gold when v is the near miss and vice versa), so repeated and disagreeing answers are covered.
FORMS: dict[str, Callable[[str, str], str]] = {
    "box_last": lambda v, o: f"So the answer is \\boxed{{{v}}}.",
    "box_first_then_text": lambda v, o: f"\\boxed{{{v}}} is what we get, since nothing else remains.",
    "box_repeated": lambda v, o: f"We get \\boxed{{{v}}}. Final: \\boxed{{{v}}}",
    "box_other_then_this": lambda v, o: f"Maybe \\boxed{{{o}}}? No, correcting: \\boxed{{{v}}}",
    "box_this_then_other": lambda v, o: f"So \\boxed{{{v}}}. Wait, actually \\boxed{{{o}}}",
    "box_unclosed": lambda v, o: f"The answer is \\boxed{{{v}",
    "box_then_unclosed_other": lambda v, o: f"So \\boxed{{{v}}}, or rather \\boxed{{{o}",
    "box_space_before_brace": lambda v, o: f"The answer is \\boxed {{{v}}}",
    "box_inner_spaces": lambda v, o: f"The answer is \\boxed{{ {v} }}",
    "box_in_dollars": lambda v, o: f"The answer is $\\boxed{{{v}}}$.",
    "box_display": lambda v, o: f"\\[\n\\boxed{{{v}}}\n\\]",
    "box_commas": lambda v, o: f"\\boxed{{{_grouped(v)}}}",
    "box_latex_commas": lambda v, o: f"\\boxed{{{_grouped(v).replace(',', '{,}')}}}",
    "box_decimal_zeros": lambda v, o: f"\\boxed{{{v}.00}}" if "." not in v else f"\\boxed{{{v}0}}",
    "box_fraction": lambda v, o: f"\\boxed{{{_as_fraction(v)}}}",
    "box_dfrac": lambda v, o: f"\\boxed{{{_as_fraction(v).replace('frac', 'dfrac')}}}",
    "box_slash_fraction": lambda v, o: f"\\boxed{{{_as_fraction(v)[5:].replace('}{', '/').strip('{}')}}}",
    "box_dollar_sign": lambda v, o: f"\\boxed{{\\${v}}}",
    "box_units_text": lambda v, o: f"\\boxed{{{v} \\text{{ dollars}}}}",
    "box_units_text_tight": lambda v, o: f"\\boxed{{{v}\\text{{dollars}}}}",
    "box_units_word": lambda v, o: f"\\boxed{{{v} apples}}",
    "box_percent": lambda v, o: f"\\boxed{{{v}\\%}}",
    "box_percent_plain": lambda v, o: f"\\boxed{{{v}%}}",
    "box_x_equals": lambda v, o: f"\\boxed{{x = {v}}}",
    "box_total_equals": lambda v, o: f"\\boxed{{total = {v}}}",
    "box_textbf": lambda v, o: f"\\boxed{{\\textbf{{{v}}}}}",
    "box_text": lambda v, o: f"\\boxed{{\\text{{{v}}}}}",
    "box_trailing_dot": lambda v, o: f"\\boxed{{{v}.}}",
    "box_scientific": lambda v, o: f"\\boxed{{{float(v):.3e}}}",
    "box_expression": lambda v, o: f"\\boxed{{{v} + 0}}",
    "box_then_hashes_other": lambda v, o: f"\\boxed{{{o}}}\n#### {v}",
    "hashes": lambda v, o: f"#### {v}",
    "hashes_commas": lambda v, o: f"#### {_grouped(v)}",
    "hashes_dollar": lambda v, o: f"#### ${v}",
    "hashes_then_text_other": lambda v, o: f"#### {v}\nCheck: that leaves {o} for later.",
    "answer_is": lambda v, o: f"The answer is {v}.",
    "answer_is_commas": lambda v, o: f"The answer is {_grouped(v)}.",
    "answer_is_dollars": lambda v, o: f"The answer is ${v}.",
    "answer_colon": lambda v, o: f"Final answer: {v}",
    "result_equals": lambda v, o: f"The result = {v}",
    "answer_then_check_other": lambda v, o: f"The answer is {v}. Check: {o} is too many.",
    "tail_number": lambda v, o: f"Adding them up, we get {v}",
    "tail_inline_math": lambda v, o: f"Adding them up, we get ${v}$.",
    "tail_display_math": lambda v, o: f"Adding them up:\n\\[ {v} \\]",
    "tail_bold": lambda v, o: f"**{v}**",
    "fbox": lambda v, o: f"\\fbox{{{v}}}",
    "boxed_no_braces": lambda v, o: f"\\boxed {v}",
    "nothing": lambda v, o: "I am not sure how to finish this problem.",
}


def cases() -> Iterator[dict]:
    n = 0
    for gi, gold in enumerate(GOLDS):
        lead = LEADS[gi % len(LEADS)]
        wrong = _near_miss(gold)
        for form, write in FORMS.items():
            for label, value, other in (("right", gold, wrong), ("wrong", wrong, gold)):
                if form == "nothing" and label == "wrong":
                    continue
                yield {"id": f"gsm8k-{n:05d}", "task": "gsm8k", "verifier": "math", "form": f"{form}_{label}",
                       "completion": lead + write(value, other), "answer": gold, "meta": {}}
                n += 1


def main() -> int:
    rows = list(cases())
    tmp = OUT.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows), encoding="utf-8")
    tmp.replace(OUT)
    print(f"wrote {OUT}: {len(rows)} cases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
