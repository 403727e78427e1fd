"""Check /app/lru.py's LRUCache: behaviour, against a reference model, and O(1) speed.

The agent's class runs only in an untrusted child (verifykit.run_python) that plays scripts of
operations and reports each one's outcome; this process plays the same scripts on a reference
implementation and compares. The speed test is timed from here, around the child.
"""

import sys
import time
from collections import OrderedDict

sys.path.insert(0, "/tests")
import verifykit as vk  # noqa: E402

# Played by the child on the agent's class, and here on Reference: each operation is
# [name, cache slot, *arguments]; its outcome ["ok", value] or ["raises", exception class names].
RUNNER = """
import json as _json

def _outcome(value):
    try:
        _json.dumps(value)
    except (TypeError, ValueError):
        return ["unserializable", type(value).__name__]
    return ["ok", value]

def play(cls, ops):
    caches, out = {}, []
    for op, slot, *args in ops:
        try:
            if op == "new":
                caches[slot] = cls(*args)
                value = None
            elif op == "capacity":
                value = caches[slot].capacity
            elif op == "set_capacity":
                caches[slot].capacity = args[0]
                value = None
            elif op in ("get", "put"):
                value = getattr(caches[slot], op)(*args)
            elif op == "len":
                value = len(caches[slot])
            elif op == "in":
                value = args[0] in caches[slot]
            elif op == "keys":
                keys = caches[slot].keys()
                value = keys if type(keys) is list else ["not a list", type(keys).__name__]
            elif op == "keys_is_copy":
                caches[slot].keys().append(99)
                value = caches[slot].keys()
            elif op == "workload":
                value = workload(cls)
            else:
                raise ValueError(op)
        except Exception as exc:
            out.append(["raises", [c.__name__ for c in type(exc).__mro__]])
        else:
            out.append(_outcome(value))
    return out

def workload(cls):
    cache = cls(100_000)
    for i in range(150_000):
        cache.put(i, i)
    right = all(cache.get(i) == i for i in range(50_000, 150_000, 2))
    for i in range(150_000, 250_000):
        cache.put(i, -i)
        cache.get(i - 60_000)
    return [right, len(cache), cache.get(0), cache.get(249_999)]
"""
DRIVER = RUNNER + "from lru import LRUCache\nreport([play(LRUCache, ops) for ops in PAYLOAD])\n"
SPEED_LIMIT_S = 10.0


class Reference:
    """What instruction.md specifies."""

    def __init__(self, capacity):
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity <= 0:
            raise ValueError(capacity)
        self._capacity, self._data = capacity, OrderedDict()

    @property
    def capacity(self):
        return self._capacity

    def get(self, key, default=None):
        if key not in self._data:
            return default
        self._data.move_to_end(key)
        return self._data[key]

    def put(self, key, value):
        if key in self._data:
            self._data.move_to_end(key)
        elif len(self._data) >= self._capacity:
            self._data.popitem(last=False)
        self._data[key] = value

    def __len__(self):
        return len(self._data)

    def __contains__(self, key):
        return key in self._data

    def keys(self):
        return list(self._data)


def model_sequence():
    """A long deterministic sequence of puts and gets, with the keys after each step."""
    ops, state = [["new", 0, 5]], 12345
    for step in range(3000):
        state = (state * 1103515245 + 12345) % (2**31)
        key = state % 11
        ops.append(["put", 0, key, step] if (state >> 8) % 3 else ["get", 0, key, "absent"])
        ops += [["keys", 0], ["len", 0]]
    return ops


SCRIPTS = {
    "capacity property": [["new", 0, 3], ["capacity", 0]],
    "capacity is read-only": [["new", 0, 3], ["set_capacity", 0, 5], ["capacity", 0]],
    **{f"invalid capacity {bad!r}": [["new", 0, bad]] for bad in (0, -1, 2.5, True, "3", None)},
    "starts empty": [["new", 0, 2], ["len", 0], ["keys", 0], ["get", 0, "missing"]],
    "get and put": [["new", 0, 2], ["put", 0, "a", 1], ["put", 0, "b", 2], ["get", 0, "a"], ["get", 0, "b"],
                    ["len", 0]],
    "default": [["new", 0, 2], ["get", 0, "x", 42], ["put", 0, "x", None], ["get", 0, "x", 42]],
    "evicts the least recently put": [["new", 0, 2], ["put", 0, "a", 1], ["put", 0, "b", 2], ["put", 0, "c", 3],
                                      ["in", 0, "a"], ["keys", 0], ["len", 0]],
    "get counts as a use": [["new", 0, 2], ["put", 0, "a", 1], ["put", 0, "b", 2], ["get", 0, "a"],
                            ["put", 0, "c", 3], ["keys", 0], ["get", 0, "b"]],
    "a missing get changes nothing": [["new", 0, 2], ["put", 0, "a", 1], ["put", 0, "b", 2], ["get", 0, "zzz"],
                                      ["keys", 0]],
    "an update counts as a use and does not evict": [
        ["new", 0, 2], ["put", 0, "a", 1], ["put", 0, "b", 2], ["put", 0, "a", 10], ["len", 0], ["keys", 0],
        ["put", 0, "c", 3], ["keys", 0], ["get", 0, "a"]],
    "contains and keys do not count as a use": [
        ["new", 0, 2], ["put", 0, "a", 1], ["put", 0, "b", 2], ["in", 0, "a"], ["keys", 0], ["put", 0, "c", 3],
        ["in", 0, "a"], ["keys", 0]],
    "keys returns a copy": [["new", 0, 3], ["put", 0, 1, "x"], ["keys_is_copy", 0]],
    "capacity one": [["new", 0, 1], ["put", 0, 1, "one"], ["put", 0, 2, "two"], ["keys", 0], ["get", 0, 1],
                     ["get", 0, 2]],
    "independent instances": [["new", 0, 2], ["new", 1, 2], ["put", 0, "k", 1], ["in", 1, "k"], ["len", 1]],
    "against a reference model": model_sequence(),
}  # fmt: skip


def same(expected, got):
    if not isinstance(got, list) or len(got) != 2:
        return False
    if expected[0] == "raises":
        return got[0] == "raises" and isinstance(got[1], list) and expected[1][0] in got[1]
    return got[0] == "ok" and got[1] == expected[1] and type(got[1]) is type(expected[1])


def compare(name, ops, expected, got):
    if not isinstance(got, list) or len(got) != len(ops):
        raise vk.Failure(f"{name}: the code under test reported {type(got).__name__}, not one outcome per step")
    for step, (op, want, outcome) in enumerate(zip(ops, expected, got)):
        if not same(want, outcome):
            raise vk.Failure(f"{name}, step {step} {op}: expected {want}, got {outcome}")


def check():
    namespace = {}
    exec(RUNNER, namespace)  # the runner is ours; only Reference, our class, runs here
    play = namespace["play"]
    scripts = list(SCRIPTS.values())
    results = vk.run_python(DRIVER, scripts, path="/app", timeout_s=30)
    if not isinstance(results, list) or len(results) != len(scripts):
        raise vk.Failure("the code under test reported results of the wrong shape")
    for (name, ops), got in zip(SCRIPTS.items(), results):
        compare(name, ops, play(Reference, ops), got)
    print(f"ok: {len(SCRIPTS)} behaviour scripts")

    workload = [["workload", 0]]
    started = time.monotonic()
    try:
        got = vk.run_python(DRIVER, [workload], path="/app", timeout_s=SPEED_LIMIT_S + 2)
    except vk.Failure as exc:
        raise vk.Failure(f"get/put are not O(1): 400,000 operations at capacity 100,000 failed ({exc})") from None
    elapsed = time.monotonic() - started
    if not isinstance(got, list) or len(got) != 1:
        raise vk.Failure("the code under test reported results of the wrong shape")
    compare("the large workload", workload, play(Reference, workload), got[0])
    if elapsed > SPEED_LIMIT_S + 2:
        raise vk.Failure(f"get/put are not O(1): the workload took {elapsed:.1f} s")
    print(f"ok: the large workload took {elapsed:.2f} s")


vk.main(check, budget_s=100)
