#!/bin/bash
[ -f /workspace/top_customer.txt ] || { echo "no top_customer.txt"; exit 1; }
[ "$(tr -d '[:space:]' < /workspace/top_customer.txt)" = Chen ] || { echo "got $(cat /workspace/top_customer.txt)"; exit 1; }
echo PASS
