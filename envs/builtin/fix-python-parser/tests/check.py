"""Check /app/kvparse.py's parse() against the whole specification in its docstring.

The agent's module is imported only in an untrusted child (verifykit.run_python), which parses the
cases' inputs and reports what parse() returned or raised; the expected values stay in this process.
"""

import sys

sys.path.insert(0, "/tests")
import verifykit as vk  # noqa: E402

ERROR = "ValueError"
CASES = [
    ("host=db1; port=5432", {"host": "db1", "port": "5432"}),
    ("  a =  1 ;b=2  ;   c= three words ", {"a": "1", "b": "2", "c": "three words"}),
    ("", {}),
    ("  ;  ; ", {}),
    ("k=v;", {"k": "v"}),
    ("k=; j = ", {"k": "", "j": ""}),
    ("expr=a=b=c; x=1", {"expr": "a=b=c", "x": "1"}),
    ("a=1; a=2", {"a": "2"}),
    ("a=1; oops; b=2", ERROR),
    ("=value", ERROR),
    ("a=1;  = 2", ERROR),
    # Escapes.
    (r"label=a\;b; size=3", {"label": "a;b", "size": "3"}),
    (r"k=a\;", {"k": "a;"}),
    (r"dir=C:\\", {"dir": "C:\\"}),
    (r"a=x\\; b=2", {"a": "x\\", "b": "2"}),
    (r"a\=b=c", {"a=b": "c"}),
    (r"k=1\=2", {"k": "1=2"}),
    (r"sql=SELECT 1\; SELECT 2; path=\\\\srv\\share; eq=\=\=; z=end",
     {"sql": "SELECT 1; SELECT 2", "path": "\\\\srv\\share", "eq": "==", "z": "end"}),
    (r"k=\a\b", {"k": "ab"}),
    ("k=abc\\", {"k": "abc\\"}),
    (r"a\;b", ERROR),
]

# Runs in the child: a dict of str to str is reported as its items, anything else by its type.
DRIVER = """
from kvparse import parse
results = []
for text in PAYLOAD:
    try:
        value = parse(text)
    except Exception as exc:
        results.append({"raises": [c.__name__ for c in type(exc).__mro__]})
        continue
    if isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        results.append({"items": [[k, v] for k, v in value.items()]})
    else:
        results.append({"type": type(value).__name__})
report(results)
"""


def matches(expected, got):
    if expected == ERROR:
        return isinstance(got.get("raises"), list) and ERROR in got["raises"]
    items = got.get("items")
    if not isinstance(items, list) or not all(isinstance(i, list) and len(i) == 2 for i in items):
        return False
    return len(items) == len(expected) and dict(map(tuple, items)) == expected


def check():
    results = vk.run_python(DRIVER, [text for text, _ in CASES], path="/app", timeout_s=20)
    if not isinstance(results, list) or len(results) != len(CASES) or not all(isinstance(r, dict) for r in results):
        raise vk.Failure("the code under test reported results of the wrong shape")
    failures = [f"parse({text!r}): expected {expected!r}, got {got}"
                for (text, expected), got in zip(CASES, results) if not matches(expected, got)]  # fmt: skip
    if failures:
        raise vk.Failure("\n  " + "\n  ".join(failures))
    print(f"ok: {len(CASES)} cases")


vk.main(check, budget_s=45)
