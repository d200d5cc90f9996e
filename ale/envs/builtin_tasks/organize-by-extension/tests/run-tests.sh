#!/bin/bash
cd /workspace/downloads || exit 1
for e in txt csv log; do [ -d $e ] || { echo "missing dir $e"; exit 1; }; done
[ -z "$(find . -maxdepth 1 -type f)" ] || { echo "files left at top level"; exit 1; }
for f in txt/notes.txt txt/todo.txt txt/readme.txt csv/sales.csv csv/users.csv log/app.log log/error.log; do
  [ -f "$f" ] || { echo "missing $f"; exit 1; }
done
[ "$(cat txt/notes.txt)" = notes ] || exit 1
echo PASS
