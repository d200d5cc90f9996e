#!/bin/bash
cd /workspace/src || exit 1
n=$(grep -rn 'old_fetch(' --include=*.py . | grep -v '^./compat.py' | wc -l)
[ "$n" = 0 ] || { echo "$n old_fetch calls left"; exit 1; }
[ "$(grep -ro 'fetch_v2(' --include=*.py . | wc -l)" = 4 ] || { echo "expected 4 fetch_v2 calls"; exit 1; }
grep -q 'def old_fetch(' compat.py || { echo "compat.py changed"; exit 1; }
grep -q 'old_fetcher = 1' api/client.py || { echo "unrelated text changed"; exit 1; }
python3 -c "import ast,sys; [ast.parse(open(f).read()) for f in sys.argv[1:]]" main.py api/client.py || exit 1
echo PASS
