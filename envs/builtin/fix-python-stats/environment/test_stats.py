import unittest

from stats import mean, median, stdev, variance


class MeanTest(unittest.TestCase):
    def test_mean(self):
        self.assertAlmostEqual(mean([1, 2, 3, 4]), 2.5)

    def test_mean_empty(self):
        with self.assertRaises(ValueError):
            mean([])


class MedianTest(unittest.TestCase):
    def test_odd_sorted(self):
        self.assertEqual(median([1, 3, 5]), 3)

    def test_odd_unsorted(self):
        self.assertEqual(median([9, 1, 5]), 5)

    def test_even(self):
        self.assertAlmostEqual(median([4, 1, 3, 2]), 2.5)

    def test_empty(self):
        with self.assertRaises(ValueError):
            median([])


class VarianceTest(unittest.TestCase):
    def test_variance(self):
        self.assertAlmostEqual(variance([2, 4, 4, 4, 5, 5, 7, 9]), 32 / 7)

    def test_stdev(self):
        self.assertAlmostEqual(stdev([1, 2, 3, 4, 5]), 2.5 ** 0.5)

    def test_too_few(self):
        with self.assertRaises(ValueError):
            variance([3])


if __name__ == "__main__":
    unittest.main()
