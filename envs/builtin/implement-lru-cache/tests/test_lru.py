import time
import unittest

from lru import LRUCache


class ConstructionTest(unittest.TestCase):
    def test_capacity_property(self):
        self.assertEqual(LRUCache(3).capacity, 3)

    def test_capacity_read_only(self):
        cache = LRUCache(3)
        with self.assertRaises(AttributeError):
            cache.capacity = 5
        self.assertEqual(cache.capacity, 3)

    def test_invalid_capacity(self):
        for bad in (0, -1, 2.5, True, "3", None):
            with self.subTest(capacity=bad), self.assertRaises(ValueError):
                LRUCache(bad)

    def test_starts_empty(self):
        cache = LRUCache(2)
        self.assertEqual(len(cache), 0)
        self.assertEqual(cache.keys(), [])
        self.assertIsNone(cache.get("missing"))


class BehaviourTest(unittest.TestCase):
    def test_get_put(self):
        cache = LRUCache(2)
        cache.put("a", 1)
        cache.put("b", 2)
        self.assertEqual(cache.get("a"), 1)
        self.assertEqual(cache.get("b"), 2)
        self.assertEqual(len(cache), 2)

    def test_default(self):
        cache = LRUCache(2)
        self.assertEqual(cache.get("x", 42), 42)
        cache.put("x", None)
        self.assertIsNone(cache.get("x", 42))

    def test_evicts_least_recently_put(self):
        cache = LRUCache(2)
        cache.put("a", 1)
        cache.put("b", 2)
        cache.put("c", 3)
        self.assertNotIn("a", cache)
        self.assertEqual(cache.keys(), ["b", "c"])
        self.assertEqual(len(cache), 2)

    def test_get_counts_as_use(self):
        cache = LRUCache(2)
        cache.put("a", 1)
        cache.put("b", 2)
        cache.get("a")
        cache.put("c", 3)
        self.assertEqual(cache.keys(), ["a", "c"])
        self.assertIsNone(cache.get("b"))

    def test_missing_get_changes_nothing(self):
        cache = LRUCache(2)
        cache.put("a", 1)
        cache.put("b", 2)
        cache.get("zzz")
        self.assertEqual(cache.keys(), ["a", "b"])

    def test_update_counts_as_use_and_does_not_evict(self):
        cache = LRUCache(2)
        cache.put("a", 1)
        cache.put("b", 2)
        cache.put("a", 10)
        self.assertEqual(len(cache), 2)
        self.assertEqual(cache.keys(), ["b", "a"])
        cache.put("c", 3)
        self.assertEqual(cache.keys(), ["a", "c"])
        self.assertEqual(cache.get("a"), 10)

    def test_contains_and_keys_do_not_count_as_use(self):
        cache = LRUCache(2)
        cache.put("a", 1)
        cache.put("b", 2)
        self.assertIn("a", cache)
        cache.keys()
        cache.put("c", 3)
        self.assertNotIn("a", cache)
        self.assertEqual(cache.keys(), ["b", "c"])

    def test_keys_returns_a_copy(self):
        cache = LRUCache(3)
        cache.put(1, "x")
        keys = cache.keys()
        keys.append(99)
        self.assertEqual(cache.keys(), [1])

    def test_capacity_one(self):
        cache = LRUCache(1)
        cache.put(1, "one")
        cache.put(2, "two")
        self.assertEqual(cache.keys(), [2])
        self.assertIsNone(cache.get(1))
        self.assertEqual(cache.get(2), "two")

    def test_independent_instances(self):
        a, b = LRUCache(2), LRUCache(2)
        a.put("k", 1)
        self.assertNotIn("k", b)
        self.assertEqual(len(b), 0)

    def test_against_reference_model(self):
        # A long deterministic sequence, checked against a simple (slow) list-based model.
        cache = LRUCache(5)
        model_keys, model = [], {}
        state = 12345
        for step in range(3000):
            state = (state * 1103515245 + 12345) % (2**31)
            key = state % 11
            if (state >> 8) % 3:
                cache.put(key, step)
                if key in model:
                    model_keys.remove(key)
                elif len(model_keys) == 5:
                    del model[model_keys.pop(0)]
                model_keys.append(key)
                model[key] = step
            else:
                expected = model.get(key, "absent")
                if key in model:
                    model_keys.remove(key)
                    model_keys.append(key)
                self.assertEqual(cache.get(key, "absent"), expected, f"step {step}")
            self.assertEqual(cache.keys(), model_keys, f"step {step}")
            self.assertEqual(len(cache), len(model_keys))


class PerformanceTest(unittest.TestCase):
    LIMIT_S = 10.0

    def check_time(self, started):
        elapsed = time.perf_counter() - started
        self.assertLess(elapsed, self.LIMIT_S, "get/put are not O(1): the workload takes too long")

    def test_large_workload_is_fast(self):
        cache = LRUCache(100_000)
        started = time.perf_counter()
        for i in range(150_000):
            cache.put(i, i)
            if i % 1000 == 0:
                self.check_time(started)
        for i in range(50_000, 150_000, 2):
            self.assertEqual(cache.get(i), i)
            if i % 1000 == 0:
                self.check_time(started)
        for i in range(150_000, 250_000):
            cache.put(i, -i)
            cache.get(i - 60_000)
            if i % 1000 == 0:
                self.check_time(started)
        self.check_time(started)
        self.assertEqual(len(cache), 100_000)
        self.assertIsNone(cache.get(0))
        self.assertEqual(cache.get(249_999), -249_999)


if __name__ == "__main__":
    unittest.main()
