"""Agent: multi-turn tool use. The policy calls tools, the environment answers, the policy goes on.

    prompt:      "sam buys 3 kites and 2 cups. how much does sam pay?\\n"
    transcript:  "<call>lookup price cup</call><result>4</result>\\n"          <- env text in the middle
                 "<call>lookup price kite</call><result>7</result>\\n"
                 "<call>calc 3*7+2*4</call><result>29</result>\\n"
                 "answer: 29"

Tools (one call = `<call>TOOL ARGS</call>`, reply = `<result>TEXT</result>`):
    lookup price ITEM    the item's price from this example's price table (`unknown` if absent)
    calc EXPR            integer arithmetic with + - * and parentheses (`error` if malformed)
Levels: 1 = one lookup; 2 = a lookup and a product; 3 = two items; 4 = two items and change from a bill.
Prices differ per example, so the policy cannot answer without calling `lookup`. Demonstrations vary
the order of lookups, whether arithmetic goes through `calc` or is written out, the form and
operand order of the expression, and short connecting remarks. A wrong demonstration miscounts one
quantity or uses the wrong item's price (the environment still answers truthfully), so the final
answer is wrong.

How the RL engine runs a row (and how to mask what the policy did not write):
  1. generate with stop strings `stop_strings` = ("<eos>", "</call>"); both are single tokens in
     bebop's tokenizer, so they are plain stop tokens (`bebop.engine.stops.split_stops`);
  2. if the completion so far ends with `</call>`, `reply = task.env.respond(example, completion)`
     is a string: encode it, append it to the row with loss mask 0, and generate again;
  3. `respond` returns None when the row ended otherwise (EOS, budget) or after `max_turns` calls:
     the row is finished and `reward` reads its last `answer:` line.
The engine knows exactly which tokens it appended (step 2), which is the authoritative mask. For
our own texts (demonstrations in pretraining) `tool_mask` rebuilds it from the markers: every token
from `<result>` through `</result>` came from the environment.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from bebop.data.tasks.base import Example, Rng, Task
from bebop.data.tokenizer import CALL_CLOSE, CALL_OPEN, EOS, RESULT_CLOSE, RESULT_OPEN

ITEMS = ("apple", "pen", "cup", "book", "egg", "lamp", "kite", "ball", "hat", "cake", "sock", "bell")
NAMES = ("ann", "bob", "cal", "dan", "eve", "fay", "gus", "kim", "max", "sam", "tom", "zoe")
BILLS = (20, 50, 100)
_MAX_EXPR_CHARS = 40
_ARITHMETIC_CHARS = re.compile(r"[0-9+\-*() \t]*")


@dataclass(frozen=True)
class AgentConfig:
    levels: tuple[int, ...] = (1, 2, 3, 4)
    max_turns: int = 4  # tool calls the environment answers per episode; later calls get no reply
    table_size: int = 4  # items in each example's price table (the asked ones plus distractors)
    max_price: int = 9
    max_quantity: int = 5

    def __post_init__(self) -> None:
        if not self.levels or any(not 1 <= lv <= 4 for lv in self.levels):
            raise ValueError(f"levels must be a non-empty subset of 1..4, got {self.levels}")
        if self.max_turns < max(self.levels):  # level L's demonstrations make up to L calls
            raise ValueError(f"max_turns must be >= {max(self.levels)} for levels {self.levels}, got {self.max_turns}")
        if not 2 <= self.table_size <= len(ITEMS):
            raise ValueError(f"table_size must be in 2..{len(ITEMS)}, got {self.table_size}")
        if self.max_price < 2 or self.max_quantity < 2:
            raise ValueError(f"max_price and max_quantity must be >= 2, got {self.max_price}, {self.max_quantity}")
        if 2 * self.max_price * self.max_quantity >= max(BILLS):
            raise ValueError(f"a level-4 bill can be at most {max(BILLS)}: lower max_price or max_quantity")

    @classmethod
    def tiny(cls) -> "AgentConfig":
        return cls(levels=(1, 2), max_turns=2, table_size=3, max_price=5, max_quantity=3)


def calc(expression: str) -> int | None:
    """Evaluate integer + - * arithmetic with parentheses; None if it is anything else."""
    # Checked before parsing: the parser warns (on stderr, mid-run) about text like "3and" that it still accepts.
    if len(expression) > _MAX_EXPR_CHARS or not _ARITHMETIC_CHARS.fullmatch(expression.strip()):
        return None
    try:
        return _evaluate(ast.parse(expression.strip(), mode="eval").body)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _evaluate(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_evaluate(node.operand)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult)):
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Add):
            return left + right
        return left - right if isinstance(node.op, ast.Sub) else left * right
    raise ValueError("not integer + - * arithmetic")


class AgentEnv:
    """The environment side of the protocol: answers the tool call a completion ends with."""

    def __init__(self, max_turns: int):
        self.max_turns = max_turns

    def respond(self, example: Example, transcript: str) -> str | None:
        """`<result>...</result>` for the call `transcript` (the completion so far) ends with, else None."""
        if not isinstance(transcript, str) or EOS in transcript or not transcript.endswith(CALL_CLOSE):
            return None
        if transcript.count(CALL_CLOSE) > self.max_turns:
            return None
        start = transcript.rfind(CALL_OPEN)
        body = transcript[start + len(CALL_OPEN) : -len(CALL_CLOSE)] if start >= 0 else ""
        return f"{RESULT_OPEN}{self.run_tool(example, body)}{RESULT_CLOSE}"

    def run_tool(self, example: Example, call: str) -> str:
        tool, _, args = call.strip().partition(" ")
        if tool == "calc":
            value = calc(args)
            return "error" if value is None else str(value)
        if tool == "lookup":
            table, _, key = args.strip().partition(" ")
            if table == "price" and key.strip() in example.meta["prices"]:
                return str(example.meta["prices"][key.strip()])
            return "unknown"
        return "error"


def tool_mask(tokens: list[int], result_open_id: int, result_close_id: int) -> list[bool]:
    """True for tokens the policy wrote, False for environment replies (`<result>` through `</result>`)."""
    mask, inside = [], False
    for token in tokens:
        inside = inside or token == result_open_id
        mask.append(not inside)
        inside = inside and token != result_close_id
    return mask


class AgentTask(Task):
    name = "agent"
    stop_strings = (EOS, CALL_CLOSE)

    def __init__(self, config: AgentConfig | None = None):
        self.config = config or AgentConfig()
        self.levels = tuple(self.config.levels)
        self.env = AgentEnv(self.config.max_turns)

    def _example(self, rng: Rng, level: int) -> Example:
        cfg = self.config
        table = rng.sample(ITEMS, cfg.table_size)
        prices = {item: rng.integer(1, cfg.max_price) for item in table}
        asked = table[: 1 if level <= 2 else 2]
        quantities = [1 if level == 1 else rng.integer(2, cfg.max_quantity) for _ in asked]
        name = rng.choice(NAMES)
        total = sum(q * prices[item] for q, item in zip(quantities, asked))
        goods = " and ".join(f"{q} {item}s" for q, item in zip(quantities, asked))
        bill = min(b for b in BILLS if b > total) if level == 4 else None
        if level == 1:
            prompt = rng.choice((f"how much does one {asked[0]} cost?", f"what is the price of one {asked[0]}?"))
        elif level == 4:
            prompt = f"{name} buys {goods} and pays with {bill}. how much change does {name} get?"
        else:
            prompt = f"{name} buys {goods}. how much does {name} pay?"
        answer = total if bill is None else bill - total
        meta = {"prices": prices, "items": asked, "quantities": quantities, "bill": bill, "name": name}
        return Example(prompt=prompt + "\n", answer=answer, level=level, meta=meta, task=self.name)

    def _demonstrate(self, example: Example, rng: Rng, wrong: bool) -> str:
        for _ in range(32):
            text = self._episode(example, rng, wrong)
            if (self.reward(example, text) == 1.0) != wrong:
                return text
        raise RuntimeError(f"could not build a {'wrong' if wrong else 'right'} episode for {example.prompt!r}")

    def _episode(self, example: Example, rng: Rng, wrong: bool) -> str:
        meta = example.meta
        items, quantities = list(meta["items"]), list(meta["quantities"])
        looked = list(items)
        if wrong:
            i = rng.integer(0, len(items) - 1)
            others = [it for it in meta["prices"] if it not in items]
            if example.level > 1 and rng.chance(0.5):
                quantities[i] += rng.choice((-1, 1))  # miscounted
            elif others:
                looked[i] = rng.choice(others)  # looked up the wrong item
            else:
                quantities[i] += 1
        if example.level == 1:
            text = rng.choice(("", "i need the price.\n", "let me look it up.\n"))
        else:
            text = rng.choice(("", "first the prices.\n", "i look up the prices.\n"))
        for i in rng.sample(range(len(items)), len(items)):  # lookup order is a free choice
            text += self._call(example, text, f"lookup price {looked[i]}") + rng.choice(("\n", " "))
        terms = [(q, meta["prices"][item]) for q, item in zip(quantities, looked)]  # what the lookups returned
        text, value = self._combine(example, rng, terms, text)
        if rng.chance(0.4) and example.level > 1:
            did = "gets back" if meta["bill"] is not None else "pays"
            text += rng.choice((f"so {meta['name']} {did} {value}.\n", f"that is {value}.\n"))
        return text + f"answer: {value}"

    def _call(self, example: Example, text: str, call: str) -> str:
        request = f"{CALL_OPEN}{call}{CALL_CLOSE}"
        return request + self.env.respond(example, text + request)

    def _combine(self, example: Example, rng: Rng, terms: list[tuple[int, int]], text: str) -> tuple[str, int]:
        """Multiply out and add (and take change) either through `calc` or written by hand."""
        if example.level == 1:
            return text, terms[0][1]
        parts = [rng.choice((f"{q}*{p}", f"{p}*{q}")) for q, p in rng.sample(terms, len(terms))]
        expr, value = "+".join(parts), sum(q * p for q, p in terms)
        bill = example.meta["bill"]
        if bill is not None and rng.chance(0.5):  # one call: bill minus the whole sum
            expr, value = f"{bill}-({expr})", bill - value
            bill = None
        if rng.chance(0.3) and len(terms) == 1:
            text += f"{expr}={value}\n"  # a single product is easy enough to write out
        else:
            text += self._call(example, text, f"calc {expr}") + "\n"
        if bill is not None:
            text += self._call(example, text, f"calc {bill}-{value}") + "\n"
            value = bill - value
        return text, value

