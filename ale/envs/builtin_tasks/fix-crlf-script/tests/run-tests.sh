#!/bin/bash
out=$(/workspace/bin/deploy.sh 2>&1) || { echo "script failed: $out"; exit 1; }
[ "$out" = deployed ] || { echo "output: $out"; exit 1; }
grep -q 'set -e' /workspace/bin/deploy.sh || { echo "script content changed"; exit 1; }
echo PASS
