#!/bin/bash
set -euo pipefail
find /workspace/data -type f -size +1048576c | LC_ALL=C sort > /workspace/large.txt
