#!/bin/bash
python3 - <<'EOF'
import csv, sys
try:
  rows = list(csv.reader(open("/workspace/users.csv", newline="")))
except Exception as e:
  sys.exit(f"cannot read users.csv: {e}")
want = [["id", "name", "email"], ["2", "Ben", "ben@example.com"], ["7", "Chen, Li", "chen@example.com"], ["11", "Dara", "dara@example.com"]]
if rows != want:
  sys.exit(f"got {rows}")
print("PASS")
EOF
