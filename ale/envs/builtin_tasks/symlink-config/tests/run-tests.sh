#!/bin/bash
[ -L /workspace/app/config.yaml ] || { echo "not a symlink"; exit 1; }
[ "$(readlink -f /workspace/app/config.yaml)" = /workspace/configs/prod.yaml ] || { echo "wrong target"; exit 1; }
grep -q 'replicas: 3' /workspace/configs/prod.yaml || { echo "prod.yaml was modified"; exit 1; }
echo PASS
