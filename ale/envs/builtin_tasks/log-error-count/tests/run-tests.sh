#!/bin/bash
python3 - <<'EOF'
import json, sys
try:
  got = json.load(open("/workspace/errors.json"))
except Exception as e:
  sys.exit(f"cannot read /workspace/errors.json: {e}")
want = {"auth": 3, "billing": 2, "search": 1}
if got != want:
  sys.exit(f"got {got}, want {want}")
print("PASS")
EOF
