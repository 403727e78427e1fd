import unittest

from stats import mean, median, stdev, variance

# (function, data, what it returns)
RETURNS = [
    (mean, [1, 2, 3, 4], 2.5),
    (median, [1, 3, 5], 3),
    (median, [9, 1, 5], 5),
    (median, [4, 1, 3, 2], 2.5),
    (variance, [2, 4, 4, 4, 5, 5, 7, 9], 32 / 7),
    (stdev, [1, 2, 3, 4, 5], 2.5 ** 0.5),
]
# (function, data it must refuse with ValueError: too few data points)
TOO_FEW = [
    (mean, []),
    (median, []),
    (variance, [3]),
]


class StatsTest(unittest.TestCase):
    def test_returns(self):
        for function, data, expected in RETURNS:
            with self.subTest(function.__name__, data=data):
                self.assertAlmostEqual(function(data), expected)

    def test_too_few_data_points(self):
        for function, data in TOO_FEW:
            with self.subTest(function.__name__, data=data):
                with self.assertRaises(ValueError):
                    function(data)


if __name__ == "__main__":
    unittest.main()
