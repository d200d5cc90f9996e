#!/bin/bash
set -euo pipefail
cd /workspace/src
grep -rl 'old_fetch(' --include=*.py . | grep -v '^./compat.py$' | xargs sed -i 's/old_fetch(/fetch_v2(/g'
