"""Writes the repetitive batch workloads of benchmarks/history_bench.py (issue: drafts learned
from earlier answers), deterministically: the same instruction over different short inputs.

    python benchmarks/workloads/make.py      # writes extract.jsonl and docstring.jsonl beside it

- extract.jsonl: 36 extraction prompts ("the fields of this support ticket as JSON"), no schema;
- docstring.jsonl: 36 "write the docstring for this function" prompts over small functions.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).parent

NAMES = ["Ana Souza", "Li Wei", "Tom Becker", "Priya Nair", "Omar Haddad", "Emma Laurent", "Kenji Sato",
         "Sara Lindqvist", "Diego Ramos", "Fatima Khan", "Jonas Weber", "Chloe Martin"]
PRODUCTS = ["the mobile app", "the billing portal", "the desktop client", "the API", "the checkout page",
            "the reporting dashboard"]
PROBLEMS = [("cannot log in after the update", "high"), ("was charged twice for the same order", "high"),
            ("sees an empty page when exporting to CSV", "medium"), ("gets a timeout on large uploads", "medium"),
            ("wants the invoice address changed", "low"), ("reports that notifications arrive late", "low"),
            ("cannot reset the password, the email never arrives", "high"),
            ("asks how to add a second user to the account", "low")]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]

EXTRACT = ("Extract the fields of this support ticket as JSON with the keys customer, product, problem, "
           "priority (low, medium or high) and day. Answer with the JSON object only.\n\nTicket: {ticket}")

FUNCTIONS = [
    ("def mean(values):\n    total = sum(values)\n    return total / len(values)"),
    ("def clamp(x, low, high):\n    return max(low, min(x, high))"),
    ("def is_palindrome(text):\n    cleaned = ''.join(c.lower() for c in text if c.isalnum())\n"
     "    return cleaned == cleaned[::-1]"),
    ("def chunks(items, size):\n    return [items[i:i + size] for i in range(0, len(items), size)]"),
    ("def word_count(text):\n    counts = {}\n    for word in text.split():\n"
     "        counts[word] = counts.get(word, 0) + 1\n    return counts"),
    ("def flatten(nested):\n    out = []\n    for part in nested:\n        out.extend(part)\n    return out"),
    ("def celsius_to_fahrenheit(c):\n    return c * 9 / 5 + 32"),
    ("def read_lines(path):\n    with open(path) as f:\n        return [line.rstrip('\\n') for line in f]"),
    ("def merge_dicts(a, b):\n    out = dict(a)\n    out.update(b)\n    return out"),
    ("def first_duplicate(items):\n    seen = set()\n    for x in items:\n        if x in seen:\n"
     "            return x\n        seen.add(x)\n    return None"),
    ("def safe_divide(a, b, default=0.0):\n    if b == 0:\n        return default\n    return a / b"),
    ("def slugify(title):\n    words = ''.join(c if c.isalnum() else ' ' for c in title.lower()).split()\n"
     "    return '-'.join(words)"),
    ("def median(values):\n    s = sorted(values)\n    n = len(s)\n    mid = n // 2\n"
     "    return s[mid] if n % 2 else (s[mid - 1] + s[mid]) / 2"),
    ("def count_vowels(text):\n    return sum(1 for c in text.lower() if c in 'aeiou')"),
    ("def unique(items):\n    seen = set()\n    out = []\n    for x in items:\n        if x not in seen:\n"
     "            seen.add(x)\n            out.append(x)\n    return out"),
    ("def parse_bool(text):\n    return text.strip().lower() in ('1', 'true', 'yes', 'on')"),
    ("def percent(part, whole):\n    return 100.0 * part / whole if whole else 0.0"),
    ("def last_n(items, n):\n    return items[-n:] if n > 0 else []"),
    ("def capitalize_words(text):\n    return ' '.join(w[:1].upper() + w[1:] for w in text.split())"),
    ("def gcd(a, b):\n    while b:\n        a, b = b, a % b\n    return a"),
    ("def factorial(n):\n    result = 1\n    for i in range(2, n + 1):\n        result *= i\n    return result"),
    ("def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a"),
    ("def invert(mapping):\n    return {v: k for k, v in mapping.items()}"),
    ("def group_by_length(words):\n    groups = {}\n    for w in words:\n"
     "        groups.setdefault(len(w), []).append(w)\n    return groups"),
    ("def rotate(items, k):\n    if not items:\n        return items\n    k %= len(items)\n"
     "    return items[k:] + items[:k]"),
    ("def running_total(values):\n    out, total = [], 0\n    for v in values:\n        total += v\n"
     "        out.append(total)\n    return out"),
    ("def strip_comments(lines):\n    return [l.split('#', 1)[0].rstrip() for l in lines]"),
    ("def to_snake_case(name):\n    out = ''\n    for c in name:\n"
     "        out += '_' + c.lower() if c.isupper() else c\n    return out.lstrip('_')"),
    ("def max_index(values):\n    best = 0\n    for i, v in enumerate(values):\n        if v > values[best]:\n"
     "            best = i\n    return best"),
    ("def pairwise(items):\n    return list(zip(items, items[1:]))"),
    ("def truncate(text, width):\n    return text if len(text) <= width else text[:width - 3] + '...'"),
    ("def histogram(values, bins):\n    low, high = min(values), max(values)\n    step = (high - low) / bins or 1\n"
     "    counts = [0] * bins\n    for v in values:\n        counts[min(int((v - low) / step), bins - 1)] += 1\n"
     "    return counts"),
    ("def is_prime(n):\n    if n < 2:\n        return False\n    for d in range(2, int(n ** 0.5) + 1):\n"
     "        if n % d == 0:\n            return False\n    return True"),
    ("def dedent_lines(lines):\n    indent = min(len(l) - len(l.lstrip()) for l in lines if l.strip())\n"
     "    return [l[indent:] for l in lines]"),
    ("def normalize(values):\n    total = sum(values)\n    return [v / total for v in values] if total else values"),
    ("def transpose(matrix):\n    return [list(row) for row in zip(*matrix)]"),
]

DOCSTRING = ("Write a Google-style docstring for this Python function. Answer with the docstring only, "
             "with Args and Returns sections.\n\n```python\n{code}\n```")


def tickets(n: int, rng: random.Random) -> list[str]:
    out = []
    for i in range(n):
        who, product, day = NAMES[i % len(NAMES)], PRODUCTS[rng.randrange(len(PRODUCTS))], DAYS[i % len(DAYS)]
        problem, _ = PROBLEMS[rng.randrange(len(PROBLEMS))]
        out.append(f"On {day}, {who} wrote in about {product}: the customer {problem}. "
                   f"Ticket number {1000 + 37 * i}.")
    return out


def main() -> None:
    rng = random.Random(38)
    with open(HERE / "extract.jsonl", "w") as f:
        for i, t in enumerate(tickets(36, rng)):
            f.write(json.dumps({"id": f"ticket-{i:02d}", "prompt": EXTRACT.format(ticket=t)}) + "\n")
    with open(HERE / "docstring.jsonl", "w") as f:
        for i, code in enumerate(FUNCTIONS):
            f.write(json.dumps({"id": f"doc-{i:02d}", "prompt": DOCSTRING.format(code=code)}) + "\n")


if __name__ == "__main__":
    main()
