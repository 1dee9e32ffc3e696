"""The functions behind the code-style tasks (`bebop.data.tasks.code_styles`): small Python functions, each a name,
its arguments, what it does in words and a reference body, with a draw of the inputs its examples and tests use.

None of them is a public benchmark's problem: they are written here, in the manner of everyday exercises (lists,
strings, counting, arithmetic), so a head can learn code of a HumanEval-like layout without ever seeing HumanEval's,
MBPP's or any test split's problems. The reference bodies are trusted code of this module: they run in-process to
compute the expected outputs that examples show and tests assert, never a model's output (that runs in the sandbox).

A function's `does` text may name parameters as {a}, {b}: each `Function.draw` fills them, so one function gives
many prompts (its name, its constants and its example inputs vary).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from bebop.data.tasks.base import Rng

WORDS = ("apple", "river", "stone", "cloud", "paper", "tiger", "lemon", "green", "table", "music", "night", "bread",
         "chair", "ocean", "smile", "light", "plant", "sugar", "house", "train", "level", "radar", "noon", "kayak")


def ints(rng: Rng, low: int = -9, high: int = 20, most: int = 7) -> list[int]:
    return [rng.integer(low, high) for _ in range(rng.integer(2, most))]


def word(rng: Rng) -> str:
    return rng.choice(WORDS)


def words(rng: Rng) -> list[str]:
    return [word(rng) for _ in range(rng.integer(2, 5))]


def text(rng: Rng) -> str:
    return " ".join(words(rng))


@dataclass(frozen=True)
class Function:
    """One function: `names` (one is drawn per prompt), `args` (the signature's parameters, with types), `does` (what
    it returns, a phrase that fills "Return ..."), `body` (the reference, indented one level, {a}/{b} filled),
    `inputs` (a draw of one call's arguments) and `consts` (a draw of {a}, {b})."""

    names: tuple[str, ...]
    args: str
    does: str
    body: str
    inputs: Callable[[Rng], tuple]
    consts: Callable[[Rng], dict] = lambda rng: {}


def _one(draw: Callable[[Rng], object]) -> Callable[[Rng], tuple]:
    return lambda rng: (draw(rng),)


def _small(rng: Rng) -> int:
    return rng.integer(2, 6)


FUNCTIONS = (
    Function(("sum_above", "total_over"), "numbers: List[int]", "the sum of the numbers greater than {a}",
             "return sum(n for n in numbers if n > {a})", _one(ints), lambda r: {"a": r.integer(0, 5)}),
    Function(("count_even", "even_count"), "numbers: List[int]", "how many of the numbers are even",
             "return sum(1 for n in numbers if n % 2 == 0)", _one(ints)),
    Function(("largest_gap", "max_difference"), "numbers: List[int]",
             "the largest value minus the smallest value, or 0 for an empty list",
             "if not numbers:\n        return 0\n    return max(numbers) - min(numbers)", _one(ints)),
    Function(("scale", "multiply_all"), "numbers: List[int]", "a new list with every number multiplied by {a}",
             "return [n * {a} for n in numbers]", _one(ints), lambda r: {"a": _small(r)}),
    Function(("clip_values", "clamp_all"), "numbers: List[int]",
             "the numbers with every value below {a} raised to {a} and every value above {b} lowered to {b}",
             "return [min(max(n, {a}), {b}) for n in numbers]", _one(ints),
             lambda r: {"a": r.integer(-3, 2), "b": r.integer(8, 15)}),
    Function(("running_total", "prefix_sums"), "numbers: List[int]", "the running totals of the numbers, in order",
             "out, total = [], 0\n    for n in numbers:\n        total += n\n        out.append(total)\n    return out",
             _one(ints)),
    Function(("second_smallest", "runner_up_low"), "numbers: List[int]",
             "the second smallest distinct value, or None when there is none",
             "values = sorted(set(numbers))\n    return values[1] if len(values) > 1 else None", _one(ints)),
    Function(("drop_duplicates", "unique_in_order"), "numbers: List[int]",
             "the numbers without repeats, each kept at its first position",
             "seen, out = set(), []\n    for n in numbers:\n        if n not in seen:\n            seen.add(n)\n"
             "            out.append(n)\n    return out", _one(lambda r: ints(r, 0, 6, 8))),
    Function(("count_multiples", "multiples_of"), "numbers: List[int]", "how many of the numbers are multiples of {a}",
             "return sum(1 for n in numbers if n % {a} == 0)", _one(ints), lambda r: {"a": r.integer(2, 5)}),
    Function(("pairwise_sums", "adjacent_sums"), "numbers: List[int]",
             "the sums of each pair of neighbouring numbers, in order",
             "return [numbers[i] + numbers[i + 1] for i in range(len(numbers) - 1)]", _one(ints)),
    Function(("mean_value", "average"), "numbers: List[int]",
             "the mean of the numbers rounded to {a} decimals, or 0.0 for an empty list",
             "if not numbers:\n        return 0.0\n    return round(sum(numbers) / len(numbers), {a})", _one(ints),
             lambda r: {"a": r.integer(1, 2)}),
    Function(("index_of_max", "argmax"), "numbers: List[int]",
             "the index of the first largest value, or -1 for an empty list",
             "if not numbers:\n        return -1\n    return numbers.index(max(numbers))", _one(ints)),
    Function(("rotate_left", "shift_left"), "numbers: List[int]", "the numbers rotated left by {a} places",
             "if not numbers:\n        return []\n    k = {a} % len(numbers)\n    return numbers[k:] + numbers[:k]",
             _one(ints), lambda r: {"a": r.integer(1, 3)}),
    Function(("all_positive", "only_positive"), "numbers: List[int]", "True when every number is greater than 0",
             "return all(n > 0 for n in numbers)", _one(lambda r: ints(r, -2, 9))),
    Function(("count_vowels", "vowel_count"), "text: str", "how many characters of text are vowels (a, e, i, o, u)",
             "return sum(1 for c in text.lower() if c in 'aeiou')", _one(text)),
    Function(("reverse_words", "words_backwards"), "text: str", "the words of text in reverse order, joined by spaces",
             "return ' '.join(text.split()[::-1])", _one(text)),
    Function(("capitalize_words", "title_words"), "text: str", "text with the first letter of every word in upper case",
             "return ' '.join(w[:1].upper() + w[1:] for w in text.split())", _one(text)),
    Function(("is_palindrome", "reads_same_backwards"), "word: str", "True when word reads the same backwards",
             "return word == word[::-1]", _one(word)),
    Function(("longest_word", "first_longest"), "text: str", "the first longest word of text, or '' when it has none",
             "best = ''\n    for w in text.split():\n        if len(w) > len(best):\n            best = w\n    return best",
             _one(text)),
    Function(("count_char", "occurrences"), "text: str, char: str", "how many times char occurs in text",
             "return sum(1 for c in text if c == char)", lambda r: (text(r), r.choice("aeiorst"))),
    Function(("repeat_each", "stutter"), "word: str", "word with every character repeated {a} times",
             "return ''.join(c * {a} for c in word)", _one(word), lambda r: {"a": r.integer(2, 3)}),
    Function(("remove_char", "strip_letter"), "text: str, char: str", "text with every occurrence of char removed",
             "return ''.join(c for c in text if c != char)", lambda r: (text(r), r.choice("aeinrt"))),
    Function(("initials", "first_letters"), "text: str", "the first letter of every word of text, in upper case",
             "return ''.join(w[0].upper() for w in text.split())", _one(text)),
    Function(("word_lengths", "length_of_words"), "words: List[str]", "the length of every word, in order",
             "return [len(w) for w in words]", _one(words)),
    Function(("join_short", "short_words"), "words: List[str]",
             "the words shorter than {a} characters, joined by a comma",
             "return ','.join(w for w in words if len(w) < {a})", _one(words), lambda r: {"a": r.integer(4, 6)}),
    Function(("sort_by_length", "shortest_first"), "words: List[str]",
             "the words sorted by length, shortest first, ties in their original order",
             "return sorted(words, key=len)", _one(words)),
    Function(("count_starting_with", "starts_count"), "words: List[str], letter: str",
             "how many words start with letter", "return sum(1 for w in words if w.startswith(letter))",
             lambda r: (words(r), r.choice("aclnprst"))),
    Function(("digit_sum", "sum_of_digits"), "n: int", "the sum of the decimal digits of n (n >= 0)",
             "total = 0\n    while n > 0:\n        total += n % 10\n        n //= 10\n    return total",
             _one(lambda r: r.integer(0, 99999))),
    Function(("factorial", "product_up_to"), "n: int", "the product of the integers from 1 to n (1 when n is 0)",
             "result = 1\n    for i in range(2, n + 1):\n        result *= i\n    return result",
             _one(lambda r: r.integer(0, 9))),
    Function(("is_prime", "prime_check"), "n: int", "True when n is a prime number",
             "if n < 2:\n        return False\n    for d in range(2, int(n ** 0.5) + 1):\n        if n % d == 0:\n"
             "            return False\n    return True", _one(lambda r: r.integer(0, 60))),
    Function(("fizz", "fizz_word"), "n: int",
             "'Fizz' when n is divisible by {a}, 'Buzz' when divisible by {b}, 'FizzBuzz' when by both, else str(n)",
             "if n % {a} == 0 and n % {b} == 0:\n        return 'FizzBuzz'\n    if n % {a} == 0:\n        return 'Fizz'\n"
             "    if n % {b} == 0:\n        return 'Buzz'\n    return str(n)", _one(lambda r: r.integer(1, 40)),
             lambda r: {"a": 3, "b": r.choice((5, 7))}),
    Function(("count_divisors", "divisor_count"), "n: int", "how many positive integers divide n (n >= 1)",
             "return sum(1 for d in range(1, n + 1) if n % d == 0)", _one(lambda r: r.integer(1, 60))),
    Function(("triangle_number", "sum_to"), "n: int", "the sum of the integers from 1 to n",
             "return n * (n + 1) // 2", _one(lambda r: r.integer(0, 100))),
    Function(("gcd_of", "common_divisor"), "a: int, b: int", "the greatest common divisor of a and b (both >= 1)",
             "while b:\n        a, b = b, a % b\n    return a", lambda r: (r.integer(1, 90), r.integer(1, 90))),
    Function(("to_binary", "binary_digits"), "n: int", "the binary digits of n (n >= 0) as a string, without a prefix",
             "return bin(n)[2:]", _one(lambda r: r.integer(0, 255))),
    Function(("collatz_steps", "steps_to_one"), "n: int",
             "how many steps of n -> n / 2 (n even) or 3n + 1 (n odd) it takes to reach 1 from n (n >= 1)",
             "steps = 0\n    while n != 1:\n        n = n // 2 if n % 2 == 0 else 3 * n + 1\n        steps += 1\n"
             "    return steps", _one(lambda r: r.integer(1, 30))),
    Function(("merge_sorted", "merge_lists"), "first: List[int], second: List[int]",
             "one sorted list of the values of two sorted lists",
             "out, i, j = [], 0, 0\n    while i < len(first) and j < len(second):\n        if first[i] <= second[j]:\n"
             "            out.append(first[i])\n            i += 1\n        else:\n            out.append(second[j])\n"
             "            j += 1\n    return out + first[i:] + second[j:]",
             lambda r: (sorted(ints(r)), sorted(ints(r)))),
    Function(("common_items", "shared_values"), "first: List[int], second: List[int]",
             "the values in both lists, sorted, each once", "return sorted(set(first) & set(second))",
             lambda r: (ints(r, 0, 8), ints(r, 0, 8))),
    Function(("chunk", "split_into_groups"), "numbers: List[int]",
             "the numbers cut into consecutive groups of {a} (the last may be shorter)",
             "return [numbers[i:i + {a}] for i in range(0, len(numbers), {a})]", _one(ints),
             lambda r: {"a": r.integer(2, 3)}),
    Function(("letter_histogram", "char_counts"), "word: str", "a dict from each letter of word to its count",
             "counts = {{}}\n    for c in word:\n        counts[c] = counts.get(c, 0) + 1\n    return counts",
             _one(word)),
)
