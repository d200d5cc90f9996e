#!/bin/bash
set -euo pipefail
cd /workspace/repo
sha=$(git reflog --format='%H %gs' | awk '!found && /commit: finish feature/ {print $1; found=1}')
git branch feature "$sha"
