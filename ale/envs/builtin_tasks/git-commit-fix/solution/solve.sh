#!/bin/bash
set -euo pipefail
cd /workspace/repo
git add README.md
git -c user.name=agent -c user.email=agent@example.com commit -qm "fix: typo in readme"
