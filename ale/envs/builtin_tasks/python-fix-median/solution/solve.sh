#!/bin/bash
set -euo pipefail
cd /workspace
python3 - <<'EOF'
src = open("stats.py").read()
src = src.replace('''  values.sort()
  return values[len(values) // 2]''', '''  s = sorted(values)
  n = len(s)
  mid = n // 2
  return s[mid] if n % 2 else (s[mid - 1] + s[mid]) / 2''')
open("stats.py", "w").write(src)
EOF
