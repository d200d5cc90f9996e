#!/bin/bash
cd /workspace && [ -f wordfreq.py ] || { echo "no wordfreq.py"; exit 1; }
out=$(printf 'The cat and the hat. THE end; a cat!\nand... Hat' | python3 wordfreq.py 3)
exp=$'the 3\nand 2\ncat 2'
[ "$out" = "$exp" ] || { echo "got:"; echo "$out"; exit 1; }
out=$(printf 'b a c b a' | python3 wordfreq.py 5)
exp=$'a 2\nb 2\nc 1'
[ "$out" = "$exp" ] || { echo "got:"; echo "$out"; exit 1; }
echo PASS
