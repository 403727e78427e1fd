"""Check /app/stats.py against the visible tests' cases plus additional ones.

The agent's module is imported only in an untrusted child (verifykit.run_python), which calls the
functions on the cases' inputs and reports what they returned or raised; the expected values stay
in this process. /app/test_stats.py is not used, so editing it does not help.
"""

import sys

sys.path.insert(0, "/tests")
import verifykit as vk  # noqa: E402

# (function, data, pass it as a generator?, expected): ("eq", x), ("approx", x) (7 places, as
# unittest's assertAlmostEqual) or ("raises", exception class name).
CASES = [
    ("mean", [1, 2, 3, 4], False, ("approx", 2.5)),
    ("mean", [], False, ("raises", "ValueError")),
    ("median", [1, 3, 5], False, ("eq", 3)),
    ("median", [9, 1, 5], False, ("eq", 5)),
    ("median", [4, 1, 3, 2], False, ("approx", 2.5)),
    ("median", [], False, ("raises", "ValueError")),
    ("variance", [2, 4, 4, 4, 5, 5, 7, 9], False, ("approx", 32 / 7)),
    ("stdev", [1, 2, 3, 4, 5], False, ("approx", 2.5 ** 0.5)),
    ("variance", [3], False, ("raises", "ValueError")),
    # Cases the visible tests do not have.
    ("median", [7, 3, 11, 5, 9], True, ("eq", 7)),
    ("median", [10.5, -2.0, 3.25, 8.0, 0.0, 100.0], False, ("approx", (3.25 + 8.0) / 2)),
    ("median", [42], False, ("eq", 42)),
    ("median", [3, 1, 2], False, ("eq", 2)),
    ("variance", [1, 3], False, ("approx", 2.0)),
    ("variance", [x * 1.5 for x in range(10)], True, ("approx", 2.25 * 55 / 6)),
    ("variance", [5, 5, 5, 5], False, ("approx", 0.0)),
    ("variance", [], False, ("raises", "ValueError")),
    ("stdev", [2, 4, 4, 4, 5, 5, 7, 9], False, ("approx", (32 / 7) ** 0.5)),
    ("mean", [1.5, 2.5, 3.5], True, ("approx", 2.5)),
]

# Runs in the child. "after" is the argument list after the call: no function may reorder it.
DRIVER = """
import stats
results = []
for name, data, as_generator in PAYLOAD:
    argument = (x for x in data) if as_generator else data
    try:
        value = getattr(stats, name)(argument)
    except Exception as exc:
        results.append({"raises": [c.__name__ for c in type(exc).__mro__], "after": data})
        continue
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    results.append({"value": float(value) if number else None, "type": type(value).__name__, "after": data})
report(results)
"""


def matches(expected, got):
    kind, want = expected
    if kind == "raises":
        return isinstance(got.get("raises"), list) and want in got["raises"]
    value = got.get("value")
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    return value == want or (kind == "approx" and round(abs(value - want), 7) == 0)


def check():
    results = vk.run_python(DRIVER, [[name, data, gen] for name, data, gen, _ in CASES], path="/app", timeout_s=20)
    if not isinstance(results, list) or len(results) != len(CASES) or not all(isinstance(r, dict) for r in results):
        raise vk.Failure("the code under test reported results of the wrong shape")
    failures = []
    for (name, data, as_generator, expected), got in zip(CASES, results):
        call = f"{name}({'generator of ' if as_generator else ''}{data})"
        if not matches(expected, got):
            failures.append(f"{call}: expected {expected[0]} {expected[1]!r}, got {got}")
        elif not as_generator and got.get("after") != data:
            failures.append(f"{call} changed its argument to {got.get('after')}")
    if failures:
        raise vk.Failure("\n  " + "\n  ".join(failures))
    print(f"ok: {len(CASES)} cases")


vk.main(check, budget_s=45)
