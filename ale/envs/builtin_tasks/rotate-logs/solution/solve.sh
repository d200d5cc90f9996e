#!/bin/bash
set -euo pipefail
cd /workspace/logs
for f in *.log; do [ "$f" = current.log ] || gzip "$f"; done
