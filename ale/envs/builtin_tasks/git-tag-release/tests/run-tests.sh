#!/bin/bash
cd /workspace/repo || exit 1
[ "$(git cat-file -t v1.2.0 2>/dev/null)" = tag ] || { echo "v1.2.0 is not an annotated tag"; exit 1; }
[ "$(git log -1 --format=%s v1.2.0)" = "release 1.2.0" ] || { echo "tag on: $(git log -1 --format=%s v1.2.0)"; exit 1; }
[ "$(git tag -l --format='%(contents:subject)' v1.2.0)" = "Release 1.2.0" ] || { echo "wrong tag message"; exit 1; }
echo PASS
