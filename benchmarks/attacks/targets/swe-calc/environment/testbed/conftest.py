import pytest


@pytest.fixture
def numbers():
    return [1.0, 2.0, 3.0, 4.0]
