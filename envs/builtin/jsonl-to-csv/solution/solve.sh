#!/bin/bash
python3 - <<'PY'
import csv
import json

COLUMNS = ["id", "type", "timestamp", "user.name", "user.country", "amount"]


def cell(value):
    return "" if value is None else str(value)


with open("/app/events.jsonl", encoding="utf-8") as src, \
        open("/app/events.csv", "w", encoding="utf-8", newline="") as dst:
    writer = csv.writer(dst, lineterminator="\n")
    writer.writerow(COLUMNS)
    for line in src:
        if not line.strip():
            continue
        event = json.loads(line)
        user = event.get("user") or {}
        writer.writerow([
            cell(event.get("id")), cell(event.get("type")), cell(event.get("timestamp")),
            cell(user.get("name")), cell(user.get("country")), cell(event.get("amount")),
        ])
PY
