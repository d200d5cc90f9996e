#!/bin/bash
cd /workspace/repo || exit 1
git rev-parse -q --verify refs/heads/feature >/dev/null || { echo "no branch feature"; exit 1; }
[ "$(git log -1 --format=%s feature)" = "finish feature" ] || { echo "feature points at: $(git log -1 --format=%s feature)"; exit 1; }
[ "$(git show feature:feature.txt | tr '\n' ' ')" = "wip more " ] || exit 1
[ "$(git log -1 --format=%s main)" = "main work" ] || { echo "main moved"; exit 1; }
echo PASS
