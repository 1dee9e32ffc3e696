"""Math answers checked with math-verify (the verifier TRL and verl use): gold text, final answer, reward.

    math_reward("Natalia sold 48 clips ... #### 72", "... so she sold 72 clips.")   # 1.0
    math_reward("\\frac{1}{2}", "the answer is \\boxed{\\frac12}")                  # 1.0 (also for "0.5")

Gold: for a GSM8K answer (a worked solution ending in `#### 72`), the text after the last `####`; any
other answer is taken as given, plain or LaTeX (`\\frac{1}{2}`). Prediction: math-verify's own extraction
from the completion (the last `\\boxed{}`, a "final answer is" phrase, else the last number or expression).
Where math-verify cannot parse one side, or the two do not verify, an exact match of the completion's final
answer (its last `\\boxed{}`, else what follows its last `####`, else its last line) against the gold, up to
case, `$` and spacing, still counts: text answers ("yes", "B") stay gradable.

The engine hands completions without their stop (`bebop.engine.stops`); text a caller decoded by hand is cut at
its first `<eos>` and trailing end-of-turn markers (`<|im_end|>`, `</s>`, ...) are dropped. Malformed output scores
0.0, never an error.

Timeouts: sympy can spend minutes on a comparison such as `9^{9^{9^9}}`, and math-verify bounds each parse
and comparison with SIGALRM, which only a process's main thread can set. On the main thread the checks run
here; from any other thread (the async RL trainer generates and scores in one) the batch goes to one helper
process (`_serve`, started once, fed JSON lines) whose main thread can.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Sequence

from bebop.data.tasks.base import strip_completion

GSM8K_MARK = "####"
TIMEOUT_S = 5  # per math-verify parse or comparison; a right answer takes milliseconds
_END_MARKERS = re.compile(r"(?:\s*(?:<\|[^|<>\s]{1,40}\|>|</s>|<eos>))+\s*$")
_BOXED = "\\boxed{"
_SERVE = "from bebop.data.tasks.answers import _serve; _serve()"
_helper: subprocess.Popen | None = None
_helper_lock = threading.Lock()


def gold_answer(answer: Any) -> str:
    """The reference answer: the text after the last `####` of a GSM8K solution, else the answer as given."""
    text = str(answer)
    return text.rsplit(GSM8K_MARK, 1)[1].strip() if GSM8K_MARK in text else text.strip()


def clean_completion(completion: str) -> str:
    """The completion up to its first `<eos>`, without trailing end-of-turn markers."""
    return _END_MARKERS.sub("", strip_completion(completion))


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` with balanced braces, or None."""
    start = text.rfind(_BOXED)
    if start < 0:
        return None
    depth, begin = 1, start + len(_BOXED)
    for i in range(begin, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[begin:i]
    return None


def final_answer(completion: str) -> str:
    """What an exact match compares: the last `\\boxed{}`, else the text after the last `####`, else the last line."""
    text = clean_completion(completion)
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    if GSM8K_MARK in text:
        return text.rsplit(GSM8K_MARK, 1)[1]
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _normal(text: str) -> str:
    return " ".join(text.replace("$", "").split()).rstrip(".").lower()


def math_reward(gold: str, completion: str) -> float:
    """1.0 if the completion's final answer equals `gold` (math-verify, else exact match), else 0.0.

    Runs math-verify with its SIGALRM timeouts: call it on a main thread (`math_rewards` routes the rest)."""
    from math_verify import parse, verify

    if not isinstance(completion, str) or not isinstance(gold, str):
        return 0.0
    text = clean_completion(completion)
    gold_parsed = parse(gold, parsing_timeout=TIMEOUT_S)
    if not gold_parsed and "\\" in gold:  # bare LaTeX (`\frac{1}{2}`): math-verify looks for it between `$`
        gold_parsed = parse(f"${gold}$", parsing_timeout=TIMEOUT_S)
    predicted = parse(text, parsing_timeout=TIMEOUT_S)
    if gold_parsed and predicted and verify(gold_parsed, predicted, timeout_seconds=TIMEOUT_S):
        return 1.0
    return 1.0 if _normal(final_answer(text)) == _normal(gold) else 0.0


def math_rewards(golds: Sequence[str], completions: Sequence[str]) -> list[float]:
    """`math_reward` over a batch, from any thread (off the main thread, in the helper process)."""
    if len(golds) != len(completions):
        raise ValueError(f"got {len(golds)} answers but {len(completions)} completions")
    if threading.current_thread() is threading.main_thread():
        return [math_reward(g, c) for g, c in zip(golds, completions)]
    return _score_in_helper(list(golds), list(completions))


def _score_in_helper(golds: list[str], completions: list[str]) -> list[float]:
    """One batch through the helper process (started on first use; one batch at a time)."""
    global _helper
    with _helper_lock:
        if _helper is None or _helper.poll() is not None:
            root = str(Path(__file__).resolve().parents[3])  # the directory holding the bebop package
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
            _helper = subprocess.Popen([sys.executable, "-c", _SERVE], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, text=True, env=env)
        _helper.stdin.write(json.dumps([golds, completions]) + "\n")
        _helper.stdin.flush()
        line = _helper.stdout.readline()
    if not line:
        raise RuntimeError(f"the math-verify helper process exited with status {_helper.wait()}")
    return json.loads(line)


def _serve() -> None:
    """The helper's loop: a JSON line [golds, completions] in, a JSON line of rewards out."""
    out, sys.stdout = sys.stdout, sys.stderr  # math-verify's messages must not mix with the replies
    for line in sys.stdin:
        golds, completions = json.loads(line)
        out.write(json.dumps([math_reward(g, c) for g, c in zip(golds, completions)]) + "\n")
        out.flush()
