#!/bin/bash
set -euo pipefail
ln -sfn /workspace/configs/prod.yaml /workspace/app/config.yaml
