#!/bin/bash
python3 - <<'PY'
import csv
from collections import defaultdict
from decimal import Decimal

totals = defaultdict(Decimal)
with open("/app/sales.csv", newline="") as f:
    for row in csv.DictReader(f):
        totals[row["region"]] += int(row["units"]) * Decimal(row["unit_price"])
with open("/app/summary.csv", "w") as out:
    out.write("region,revenue\n")
    for region in sorted(totals):
        out.write(f"{region},{totals[region]:.2f}\n")
PY
