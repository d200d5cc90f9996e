#!/bin/bash
set -euo pipefail
awk -F, 'NR>1 && $3=="paid" {s+=$4} END {printf "%.2f\n", s}' /workspace/sales.csv > /workspace/total.txt
