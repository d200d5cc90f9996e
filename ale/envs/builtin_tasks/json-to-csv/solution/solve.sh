#!/bin/bash
set -euo pipefail
python3 - <<'EOF'
import csv, json
users = sorted((u for u in json.load(open("/workspace/users.json")) if u["active"]), key=lambda u: u["id"])
with open("/workspace/users.csv", "w", newline="") as f:
  w = csv.writer(f)
  w.writerow(["id", "name", "email"])
  for u in users:
    w.writerow([u["id"], u["name"], u["email"]])
EOF
