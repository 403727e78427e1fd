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



class ExtraTest(unittest.TestCase):
    """Cases the visible tests do not have."""

    def test_median_generator_input(self):
        self.assertEqual(median(x for x in [7, 3, 11, 5, 9]), 7)

    def test_median_even_unsorted_floats(self):
        self.assertAlmostEqual(median([10.5, -2.0, 3.25, 8.0, 0.0, 100.0]), (3.25 + 8.0) / 2)

    def test_median_single(self):
        self.assertEqual(median([42]), 42)

    def test_median_does_not_mutate(self):
        data = [3, 1, 2]
        median(data)
        self.assertEqual(data, [3, 1, 2])

    def test_variance_two_points(self):
        self.assertAlmostEqual(variance([1, 3]), 2.0)

    def test_variance_generator(self):
        self.assertAlmostEqual(variance(x * 1.5 for x in range(10)), 2.25 * 55 / 6)

    def test_variance_constant(self):
        self.assertAlmostEqual(variance([5, 5, 5, 5]), 0.0)

    def test_variance_empty(self):
        with self.assertRaises(ValueError):
            variance([])

    def test_stdev_known(self):
        self.assertAlmostEqual(stdev([2, 4, 4, 4, 5, 5, 7, 9]), (32 / 7) ** 0.5)

    def test_mean_generator(self):
        self.assertAlmostEqual(mean(x for x in [1.5, 2.5, 3.5]), 2.5)


if __name__ == "__main__":
    unittest.main()
