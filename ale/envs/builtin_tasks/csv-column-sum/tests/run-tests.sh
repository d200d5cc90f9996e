#!/bin/bash
[ -f /workspace/total.txt ] || { echo "no total.txt"; exit 1; }
[ "$(tr -d '[:space:]' < /workspace/total.txt)" = "187.25" ] || { echo "wrong total: $(cat /workspace/total.txt)"; exit 1; }
echo PASS
