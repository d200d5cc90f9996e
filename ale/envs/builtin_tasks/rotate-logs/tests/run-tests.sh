#!/bin/bash
cd /workspace/logs || exit 1
for d in 01 02 03; do
  [ -f app-2024-05-$d.log.gz ] || { echo "missing app-2024-05-$d.log.gz"; exit 1; }
  [ ! -e app-2024-05-$d.log ] || { echo "original app-2024-05-$d.log still there"; exit 1; }
  [ "$(zcat app-2024-05-$d.log.gz | wc -l)" = 50 ] || { echo "bad archive"; exit 1; }
done
[ "$(cat current.log)" = live ] || { echo "current.log changed"; exit 1; }
[ ! -e current.log.gz ] && [ -f notes.txt ] || { echo "wrong files touched"; exit 1; }
echo PASS
