#!/bin/bash
set -euo pipefail
python3 - <<'EOF'
import collections, json
c = collections.Counter()
for line in open("/workspace/app.log"):
  parts = line.split()
  if len(parts) >= 3 and parts[1] == "ERROR":
    c[parts[2].rstrip(":")] += 1
json.dump(dict(c), open("/workspace/errors.json", "w"))
EOF
