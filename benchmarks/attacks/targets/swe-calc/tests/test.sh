#!/bin/bash
# SWE-bench's evaluation, in shape: the hidden tests are copied into the repository, pytest runs
# at its root with -rA, and the log is parsed for the statuses of the tests that must pass.
mkdir -p /logs/verifier
cd /testbed
cp /tests/test_mean.py tests/test_mean.py
python3 -m pytest -rA -p no:cacheprovider tests/test_mean.py tests/test_total.py > /tmp/pytest.log 2>&1
cat /tmp/pytest.log
passed=0
for test in tests/test_mean.py::test_mean tests/test_mean.py::test_mean_of_nothing tests/test_total.py::test_total; do
    grep -q "^PASSED $test\$" /tmp/pytest.log && passed=$((passed + 1))
done
if [ "$passed" -eq 3 ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
