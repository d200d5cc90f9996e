#!/bin/bash
set -euo pipefail
sed -i 's/\r$//' /workspace/bin/deploy.sh
chmod +x /workspace/bin/deploy.sh
