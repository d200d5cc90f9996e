#!/bin/bash
set -euo pipefail
cd /workspace/repo
sha=$(git log --format='%H %s' | awk '$2=="release" && $3=="1.2.0" {print $1}')
git -c user.name=agent -c user.email=agent@example.com tag -a v1.2.0 -m "Release 1.2.0" "$sha"
