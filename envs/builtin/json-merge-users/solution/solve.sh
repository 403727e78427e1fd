#!/bin/bash
python3 - <<'PY'
import json

with open("/app/users_old.json") as f:
    old = json.load(f)
with open("/app/users_new.json") as f:
    new = json.load(f)

merged = {}
for record in old:
    uid = int(record["id"])
    merged[uid] = {**record, "id": uid, "tags": list(record.get("tags") or [])}
for record in new:
    uid = int(record["id"])
    out = merged.get(uid, {"tags": []})
    for key, value in record.items():
        if key not in ("id", "tags") and value is not None:
            out[key] = value
    out["id"] = uid
    out["tags"] = out["tags"] + list(record.get("tags") or [])
    merged[uid] = out

result = []
for uid in sorted(merged):
    record = merged[uid]
    record["tags"] = sorted(set(record["tags"]))
    result.append(record)
with open("/app/users.json", "w") as f:
    json.dump(result, f, indent=2)
    f.write("\n")
PY
