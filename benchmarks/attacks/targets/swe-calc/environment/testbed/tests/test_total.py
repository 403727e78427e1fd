from calc import total


def test_total(numbers):
    assert total(numbers) == 10.0
