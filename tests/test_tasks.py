"""Tasks: determinism, exact verifiers (right / wrong / malformed), demonstrations, the agent protocol."""

from __future__ import annotations

import math
import re
import warnings

import pytest
import torch

from bebop.data import tasks
from bebop.data.tasks import AgentConfig, CodeConfig, Example, MathConfig, ProgramRejected, check_program, tool_mask
from bebop.data.tasks.agent import calc
from bebop.data.tasks.sandbox import SandboxConfig
from bebop.data.tokenizer import CALL_CLOSE, EOS, RESULT_CLOSE, RESULT_OPEN, CharTokenizer

# A loop dies at 1 s of CPU; the wall-clock limit is generous so a loaded machine does not fail correct code.
FAST_CODE = CodeConfig(sandbox=SandboxConfig(timeout_s=10.0, cpu_s=1, memory_mb=128), max_workers=2)


def make(name: str):
    return tasks.get(name, FAST_CODE) if name == "code" else tasks.get(name)


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_get_names_and_errors():
    assert [tasks.get(n).name for n in ("math", "code", "agent")] == ["math", "code", "agent"]
    with pytest.raises(ValueError, match=r"unknown task 'chess'; valid names: \['agent', 'code', 'math', 'chat', 'code_doc', 'code_fix', 'code_prose'\]"):
        tasks.get("chess")
    with pytest.raises(ValueError, match="must be a MathConfig"):
        tasks.get("math", AgentConfig())
    assert tasks.get("agent").stop_strings == (EOS, CALL_CLOSE) and tasks.get("math").stop_strings == (EOS,)


@pytest.mark.parametrize("name", ["math", "code", "agent"])
def test_sampling_is_deterministic_and_levelled(name):
    task = make(name)
    first = task.sample(20, seed=3)
    assert first == task.sample(20, seed=3)
    assert task.sample(7, seed=3) == first[:7]  # a prefix-stable stream
    assert [e.prompt for e in task.sample(20, seed=4)] != [e.prompt for e in first]
    assert {e.level for e in task.sample(60, seed=0)} == set(task.levels)
    for level in task.levels:
        examples = task.sample(10, seed=1, level=level)
        assert all(e.level == level and e.task == name and e.prompt.endswith("\n") for e in examples)
    with pytest.raises(ValueError, match="level must be one of"):
        task.sample(2, seed=0, level=99)
    with pytest.raises(ValueError, match="seed"):
        task.sample(2, seed=-1)


@pytest.mark.parametrize("name", ["math", "code", "agent"])
def test_texts_are_short_and_in_the_tokenizer_alphabet(name):
    task, tok = make(name), CharTokenizer()
    easiest = min(task.levels)
    for example in task.sample(40, seed=2):
        text = example.prompt + task.demonstration(example, gen(example.level), error_rate=0.5)
        tok.encode(text)  # raises on any character outside the alphabet
        assert len(text) <= (300 if example.level == easiest else 400)
        assert text == text.lower() or name == "code"


def test_math_reward_right_wrong_malformed():
    task = tasks.get("math")
    example = task.sample(1, seed=0, level=2)[0]
    a = example.answer
    assert task.reward(example, f"some work\nanswer: {a}") == 1.0
    assert task.reward(example, f"answer: {a}{EOS}") == 1.0
    assert task.reward(example, f"answer: {a}{EOS}answer: {a + 1}") == 1.0  # text after EOS is ignored
    assert task.reward(example, f"answer: {a + 1}\nanswer: {a}") == 1.0  # the last answer line counts
    assert task.reward(example, f"answer: {a}\nanswer: {a + 1}") == 0.0
    assert task.reward(example, f"answer: {a + 1}") == 0.0
    for bad in ["", f"{a}", "answer:", "answer: x", f"answer: {a} {a}", f"the answer: {a}", f"answer: {a}.5", None, 42]:
        assert task.reward(example, bad) == 0.0, bad


def test_agent_reward_right_wrong_malformed():
    task = tasks.get("agent")
    example = task.sample(1, seed=0, level=3)[0]
    a = example.answer
    transcript = f"<call>calc {a}</call><result>{a}</result>\nanswer: {a}"
    assert task.reward(example, transcript) == 1.0
    assert task.reward(example, transcript.replace(f"answer: {a}", f"answer: {a + 3}")) == 0.0
    for bad in ["", f"<call>calc {a}</call><result>{a}</result>", "answer: ?", f"answer: {a}!", None]:
        assert task.reward(example, bad) == 0.0, bad


def test_code_reward_right_wrong_malformed():
    task = make("code")
    example = next(e for e in task.sample(30, seed=0, level=2) if e.meta["family"] == "affine")
    a, b = example.meta["params"]["a"], example.meta["params"]["b"]
    shown = example.meta["tests"][: example.meta["shown"]]
    lookup = "def f(x):\n" + "".join(f"    if x == {x}:\n        return {y}\n" for x, y in shown) + "    return 0"
    completions = {
        example.answer: 1.0,
        f"f = lambda x: {b} + x * {a}{EOS}trailing junk": 1.0,
        f"def f(x):\n    return {a}*x+{b + 1}": 0.0,  # off by one
        lookup: 0.0,  # passes the shown pairs, fails the hidden ones
        "def f(x) return x": 0.0,  # syntax
        "def g(x):\n    return x": 0.0,  # no f
        "the answer is 2x+1": 0.0,
        "": 0.0,
        None: 0.0,
    }
    got = task.rewards([example] * len(completions), list(completions))
    assert got == list(completions.values())
    assert task.reward(example, example.answer) == 1.0


def test_code_ast_check_rejects_unsafe_programs():
    check_program("def f(x):\n    y = [i * i for i in range(x)]\n    return sum(y) if x > 2 else abs(x)")
    rejected = {
        "import os\ndef f(x):\n    return x": "Import",
        "def f(x):\n    return x.__class__": "Attribute",
        "def f(x):\n    return open('a')": "unknown name 'open'",
        "def f(x):\n    return eval('1')": "unknown name 'eval'",
        "def f(x):\n    _y = x\n    return _y": "reserved",
        "def f(x):\n    return x\nprint = f": "reserved",
        "class A:\n    pass\nf = A": "ClassDef",
        "def f(x, *a):\n    return x": "positional",
        "def f(x):\n    return x\nf(1)": "Expr",
        "def f(x):\n    return x\nwhile True:\n    y = 1": "top level",
        "def f(x):\n    return b'x'": "bytes",
        "def f(x):\n    return max(x, key=abs)": "plain",
        "f = 1\n" + "x = 1\n" * 400: "longer than",
    }
    for source, reason in rejected.items():
        with pytest.raises(ProgramRejected, match=reason):
            check_program(source)


def test_code_hostile_programs_get_zero_quickly():
    task = make("code")
    example = task.sample(1, seed=0, level=1)[0]
    hostile = [
        "def f(x):\n    while True:\n        pass",  # infinite loop: passes the AST check, dies in the sandbox
        "def f(x):\n    return len([0] * 10 ** 10)",  # huge allocation
        "def f(x):\n    return f(x + 1)",  # unbounded recursion
        "def f(x):\n    return 9 ** 9 ** 9",  # unbounded big-int work
        "import os\nf = lambda x: os.system('echo pwned')",
        "def f(x):\n    return ().__class__.__base__.__subclasses__()",
    ]
    rewards = task.rewards([example] * len(hostile), hostile)
    assert rewards == [0.0] * len(hostile)


@pytest.mark.parametrize("name, n", [("math", 300), ("agent", 300), ("code", 90)])
def test_demonstrations_are_right_and_error_rate_holds(name, n):
    task = make(name)
    examples = task.sample(n, seed=11)
    g = gen(5)
    right = task.rewards(examples, [task.demonstration(e, g) for e in examples])
    assert right == [1.0] * n
    wrong = task.rewards(examples[: n // 3], [task.demonstration(e, g, error_rate=1.0) for e in examples[: n // 3]])
    assert wrong == [0.0] * (n // 3)
    mixed = task.rewards(examples, [task.demonstration(e, g, error_rate=0.3) for e in examples])
    wrong_fraction = 1 - sum(mixed) / n
    assert abs(wrong_fraction - 0.3) <= 3.5 * math.sqrt(0.3 * 0.7 / n), wrong_fraction


@pytest.mark.parametrize("name", ["math", "code", "agent"])
def test_demonstrations_vary_in_wording_not_only_digits(name):
    task = make(name)
    for example in task.sample(4, seed=7, level=max(task.levels)):
        demos = {task.demonstration(example, gen(s)) for s in range(24)}
        shapes = {re.sub(r"\d+", "#", d) for d in demos}  # digits erased: what remains is phrasing and order
        assert len(demos) >= 4 and len(shapes) >= 3, demos
    example = task.sample(1, seed=0)[0]
    assert task.demonstration(example, gen(1)) == task.demonstration(example, gen(1))


def test_demonstration_argument_errors():
    task = tasks.get("math")
    example = task.sample(1, seed=0)[0]
    with pytest.raises(ValueError, match="error_rate"):
        task.demonstration(example, gen(), error_rate=1.5)
    with pytest.raises(ValueError, match="torch.Generator"):
        task.demonstration(example, 0)
    with pytest.raises(ValueError, match="task 'agent'"):
        tasks.get("agent").reward(example, "answer: 1")


def test_calc_rejects_non_arithmetic_without_a_parser_warning():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # "3and 4" parses, with a SyntaxWarning ("invalid decimal literal")
        for text in ("3and 4", "1if 1 else 2", "0x10", "1_000", "2.5*2", "'7'"):
            assert calc(text) is None, text
    assert not caught, [str(w.message) for w in caught]  # a policy's tool call must not print to the run's stderr
    assert calc(" 2*(3+4)-1\n") == 13 and calc("-5 * -5") == 25


def test_agent_env_protocol_and_turn_limit():
    task = tasks.get("agent", AgentConfig(max_turns=4))
    example = task.sample(1, seed=0, level=3)[0]
    item, price = next(iter(example.meta["prices"].items()))
    env = task.env
    assert env.respond(example, f"<call>lookup price {item}</call>") == f"{RESULT_OPEN}{price}{RESULT_CLOSE}"
    assert env.respond(example, "let me see <call>calc 2*(3+4)-1</call>") == "<result>13</result>"
    assert env.respond(example, "<call>lookup price dragon</call>") == "<result>unknown</result>"
    assert env.respond(example, "<call>calc __import__('os')</call>") == "<result>error</result>"
    assert env.respond(example, "<call>calc 2**99</call>") == "<result>error</result>"
    assert env.respond(example, "<call>fly away</call>") == "<result>error</result>"
    assert env.respond(example, "</call>") == "<result>error</result>"
    assert env.respond(example, "answer: 3") is None
    assert env.respond(example, f"answer: 3{EOS}<call>calc 1</call>") is None
    calls = "<call>calc 1</call><result>1</result>" * 4
    assert env.respond(example, calls[: -len("<result>1</result>")]) == "<result>1</result>"  # 4th call: answered
    assert env.respond(example, calls + "<call>calc 1</call>") is None  # 5th call: over max_turns


def test_agent_demonstration_replies_are_the_environment_and_maskable():
    task, tok = tasks.get("agent"), CharTokenizer()
    for example in task.sample(20, seed=5):
        text = task.demonstration(example, gen(example.level))
        # replaying the policy's part through the env reproduces the demonstration exactly
        replay = ""
        for piece in re.split(r"(<result>.*?</result>)", text):
            if piece.startswith(RESULT_OPEN):
                assert task.env.respond(example, replay) == piece
            replay += piece
        assert replay == text and text.count(CALL_CLOSE) <= task.config.max_turns
        ids = tok.encode(text)
        mask = tool_mask(ids, tok.token_id(RESULT_OPEN), tok.token_id(RESULT_CLOSE))
        policy = tok.decode([i for i, keep in zip(ids, mask) if keep])
        env = tok.decode([i for i, keep in zip(ids, mask) if not keep])
        assert policy == re.sub(r"<result>.*?</result>", "", text)
        assert env == "".join(re.findall(r"<result>.*?</result>", text))


def test_configs_validate_and_have_tiny_presets():
    for config_cls in (MathConfig, CodeConfig, AgentConfig):
        tiny = config_cls.tiny()
        task = tasks.get({MathConfig: "math", CodeConfig: "code", AgentConfig: "agent"}[config_cls], tiny)
        assert {e.level for e in task.sample(30, seed=0)} == set(tiny.levels)
    with pytest.raises(ValueError, match="levels"):
        MathConfig(levels=(5,))
    with pytest.raises(ValueError, match="levels"):
        CodeConfig(levels=())
    with pytest.raises(ValueError, match="max_turns"):
        AgentConfig(levels=(1, 2, 3, 4), max_turns=3)
    assert isinstance(tasks.get("math").sample(1, seed=0)[0], Example)
