#!/bin/bash
set -e
cd /app/repo
bad=$(git log --format=%H --grep='^Speed up total_value loop$' main)
git -c user.name="Oracle" -c user.email="oracle@example.com" revert --no-edit "$bad"
