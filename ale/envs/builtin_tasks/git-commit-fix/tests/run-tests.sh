#!/bin/bash
cd /workspace/repo || exit 1
[ "$(git log -1 --format=%s)" = "fix: typo in readme" ] || { echo "last commit: $(git log -1 --format=%s)"; exit 1; }
[ -z "$(git status --porcelain)" ] || { echo "tree not clean"; exit 1; }
[ "$(git show HEAD:README.md)" = "Hello world" ] || { echo "fix not committed"; exit 1; }
[ "$(git rev-list --count HEAD)" = 2 ] || { echo "expected exactly 2 commits"; exit 1; }
echo PASS
