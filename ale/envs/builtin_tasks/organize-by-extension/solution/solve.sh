#!/bin/bash
set -euo pipefail
cd /workspace/downloads
for f in *.*; do e="${f##*.}"; mkdir -p "$e"; mv "$f" "$e/"; done
