#!/bin/bash
exp=$'/workspace/data/a/b/huge.img\n/workspace/data/a/big.bin\n/workspace/data/c/with space.dat'
[ -f /workspace/large.txt ] || { echo "no /workspace/large.txt"; exit 1; }
got=$(sed -e '/^$/d' /workspace/large.txt)
[ "$got" = "$exp" ] || { echo "got:"; echo "$got"; echo "expected:"; echo "$exp"; exit 1; }
echo PASS
