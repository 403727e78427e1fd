#!/bin/bash
# Terminal-Bench 2's test.sh template, as ported tasks keep it: uv and pytest are installed at
# build time (verification has no network), and the script still sources uv's env file.
source $HOME/.local/bin/env 2>/dev/null

if [ "$PWD" = "/" ]; then
    echo "Error: No working directory set. Please set a WORKDIR in your Dockerfile before running this script."
    exit 1
fi

mkdir -p /logs/verifier
pytest /tests/test_outputs.py -rA -p no:cacheprovider

if [ $? -eq 0 ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
