from calc import mean


def test_mean(numbers):
    assert mean(numbers) == 2.5


def test_mean_of_nothing():
    assert mean([]) == 0.0
