"""math-verify's verdict, bounded in time in any thread: the one place the verifiers call math-verify.

math-verify's own time limits use SIGALRM, which works only in the main thread. In the main thread
its parse and verify run here with those limits; from any other thread (a rollout pool, a server's
handler) they run in a helper process (``python -m esgrpo.tasks.math_verify_runner --serve``) that is
killed when it runs past a hard time limit, since sympy can sit in one computation no thread can stop.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["math_verify", "paper_b_verdict", "parse_gold", "check_main_thread", "check_paper_b_main_thread",
           "VerifyWorker"]

# math-verify's own (SIGALRM) limits in the main thread, in whole seconds as signal.alarm needs.
_MV_PARSE_TIMEOUT = 2
_MV_VERIFY_TIMEOUT = 2
# Hard limit for one check in the helper process (used outside the main thread).
_WORKER_TIMEOUT_S = 8.0
_WORKER_STARTUP_S = 30.0  # imports of sympy/math-verify on a busy 2-core machine take seconds
# Paper B's evaluation calls parse and verify with math-verify's default limits (5 s each).
_MV_PAPER_B_TIMEOUT = 5


def _gold_text(gold: str) -> str:
    # Wrapping in \boxed{} makes math-verify read LaTeX golds such as \frac{1}{2} as LaTeX.
    gold = gold.strip()
    return gold if "boxed" in gold else "\\boxed{" + gold + "}"


_GOLD_PARSES: dict[str, tuple] = {}


def parse_gold(gold: str) -> tuple:
    """math-verify's parse of `gold`, remembered once it succeeds. An empty parse is not remembered:
    math-verify returns [] for a time-out too, and one slow first parse (sympy's lazy imports on a
    busy machine) would otherwise make every later answer to that gold wrong for the whole process."""
    parsed = _GOLD_PARSES.get(gold)
    if parsed is None:
        from math_verify import parse

        parsed = tuple(parse(_gold_text(gold), parsing_timeout=_MV_PARSE_TIMEOUT))
        if parsed and len(_GOLD_PARSES) < 1 << 16:
            _GOLD_PARSES[gold] = parsed
    return parsed


def check_main_thread(pred_text: str, gold: str) -> bool:
    """math-verify with its own SIGALRM time limits (main thread only)."""
    from math_verify import parse, verify

    gold_parsed = parse_gold(gold)
    if not gold_parsed:
        return False
    pred = parse(pred_text, parsing_timeout=_MV_PARSE_TIMEOUT)
    if not pred:
        return False
    return bool(verify(list(gold_parsed), pred, timeout_seconds=_MV_VERIFY_TIMEOUT))


_PAPER_B_GOLDS: dict[str, tuple] = {}


def _paper_b_gold(gold: str) -> tuple:
    """The gold as paper B's evaluation parses it: a plain expression only (no LaTeX), first match;
    remembered once the parse succeeds (see parse_gold)."""
    parsed = _PAPER_B_GOLDS.get(gold)
    if parsed is None:
        from math_verify import ExprExtractionConfig, parse

        parsed = tuple(parse(gold, extraction_config=(ExprExtractionConfig(),), extraction_mode="first_match",
                             parsing_timeout=_MV_PAPER_B_TIMEOUT))
        if parsed and len(_PAPER_B_GOLDS) < 1 << 16:
            _PAPER_B_GOLDS[gold] = parsed
    return parsed


def check_paper_b_main_thread(response: str, gold: str) -> bool | None:
    """Paper B's math-verify step (its `parse_gsm8k_prediction` and `is_gsm8k_correct`, 240d878): the
    whole completion parsed with LaTeX extraction (boxed first, units, no `nits` or malformed-operator
    fixes, no unanchored LaTeX) then plain expressions, the first match kept; verified against the gold.
    None when the completion's parse is empty (paper B then reads it with regular expressions)."""
    from math_verify import (
        ExprExtractionConfig,
        LatexExtractionConfig,
        LatexNormalizationConfig,
        parse,
        verify,
    )

    normalization = LatexNormalizationConfig(nits=False, malformed_operators=False, basic_latex=True,
                                             boxed="all", units=True)
    extraction = (LatexExtractionConfig(normalization_config=normalization, boxed_match_priority=0,
                                        try_extract_without_anchor=False), ExprExtractionConfig())
    pred = parse(response, extraction_config=extraction, extraction_mode="first_match",
                 parsing_timeout=_MV_PAPER_B_TIMEOUT)
    if not pred:
        return None
    try:
        gold_parsed = _paper_b_gold(gold)
        return bool(gold_parsed and verify(list(gold_parsed), pred, timeout_seconds=_MV_PAPER_B_TIMEOUT))
    except Exception:  # paper B counts any failure of the gold's parse or the comparison as wrong
        return False


# What a helper process answers for each kind of request, and what a helper that errs, dies or runs past
# its limit counts as: "wrong" for the project's check, "nothing parsed" for paper B's (as a math-verify
# time-out is an empty parse there).
_CHECKS = {"default": (check_main_thread, False), "paper_b": (check_paper_b_main_thread, None)}


class VerifyWorker:
    """A helper process running math-verify for calls made outside the main thread.

    A separate process (not a thread) because sympy can sit in one long computation that no
    thread can interrupt; killing the process is the only reliable stop. It is started with
    `python -m esgrpo.tasks.math_verify_runner --serve` rather than multiprocessing, whose spawn/forkserver
    start methods re-import the caller's __main__ (a Snakemake script without a main guard
    would run again) and whose fork method is unsafe in a threaded process.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._buffer = b""
        self._answered = False  # the first answer of a new helper also pays its start-up

    def _start(self) -> subprocess.Popen:
        env = dict(os.environ)
        src = str(Path(__file__).resolve().parents[2])  # the folder holding the esgrpo package (src/)
        env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.setdefault("OMP_NUM_THREADS", "1")
        self._buffer = b""
        self._answered = False
        return subprocess.Popen(
            [sys.executable, "-m", "esgrpo.tasks.math_verify_runner", "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        )

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            for pipe in (self._proc.stdin, self._proc.stdout):
                if pipe is not None:
                    pipe.close()
        self._proc = None
        self._buffer = b""

    def _read_line(self, deadline: float) -> bytes | None:
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:  # the helper died
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def check(self, pred_text: str, gold: str, timeout_s: float, kind: str = "default") -> bool | None:
        """The helper's answer to a check of `kind` (_CHECKS); that kind's failure value when the
        helper errs, dies or runs past `timeout_s`."""
        failed = _CHECKS[kind][1]
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._kill()
                self._proc = self._start()
            request = json.dumps({"pred": pred_text, "gold": gold, "kind": kind}) + "\n"
            try:
                assert self._proc.stdin is not None
                self._proc.stdin.write(request.encode())
                self._proc.stdin.flush()
            except (BrokenPipeError, OSError):
                self._kill()
                return failed
            # The first request also pays the helper's start-up (imports of sympy/math-verify).
            limit = timeout_s if self._answered else timeout_s + _WORKER_STARTUP_S
            line = self._read_line(time.monotonic() + limit)
            if line is None:
                self._kill()
                return failed
            try:
                ok = json.loads(line)["ok"]
            except (ValueError, KeyError):
                self._kill()
                return failed
            self._answered = True
            return ok if ok is None else bool(ok)

    def close(self) -> None:
        with self._lock:
            self._kill()


_WORKER = VerifyWorker()
atexit.register(_WORKER.close)


def _check_other_thread(pred_text: str, gold: str) -> bool:
    return _WORKER.check(pred_text, gold, _WORKER_TIMEOUT_S)


def math_verify(pred_text: str, gold: str) -> bool:
    """math-verify's verdict on `pred_text` against `gold`, bounded in time in any thread."""
    if threading.current_thread() is threading.main_thread():
        try:
            return check_main_thread(pred_text, gold)
        except Exception:  # math-verify's own failures (it raises on some inputs) mean "wrong"
            return False
    return _check_other_thread(pred_text, gold)


def paper_b_verdict(response: str, gold: str) -> bool | None:
    """check_paper_b_main_thread's answer, bounded in time in any thread."""
    if threading.current_thread() is threading.main_thread():
        return check_paper_b_main_thread(response, gold)
    return _WORKER.check(response, gold, _WORKER_TIMEOUT_S + 2 * _MV_PAPER_B_TIMEOUT, kind="paper_b")


def _serve() -> None:
    """Helper-process loop: one JSON request per stdin line, one JSON answer per stdout line."""
    out = sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but answers may reach the pipe
    for raw in sys.stdin.buffer:
        check, failed = check_main_thread, False
        try:
            request = json.loads(raw)
            check, failed = _CHECKS[request.get("kind", "default")]
            ok = check(request["pred"], request["gold"])
        except Exception:
            ok = failed
        out.write((json.dumps({"ok": ok if ok is None else bool(ok)}) + "\n").encode())
        out.flush()


def _main(argv: list[str]) -> Any:
    if argv == ["--serve"]:
        _serve()
        return 0
    print("usage: python -m esgrpo.tasks.math_verify_runner --serve   (the math-verify helper process)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
