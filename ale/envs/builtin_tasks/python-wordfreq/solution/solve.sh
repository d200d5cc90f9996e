#!/bin/bash
set -euo pipefail
cat > /workspace/wordfreq.py <<'EOF'
import collections
import re
import sys

n = int(sys.argv[1])
words = re.findall(r"[a-z]+", sys.stdin.read().lower())
for w, c in sorted(collections.Counter(words).items(), key=lambda kv: (-kv[1], kv[0]))[:n]:
  print(w, c)
EOF
