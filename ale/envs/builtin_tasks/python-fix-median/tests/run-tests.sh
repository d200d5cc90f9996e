#!/bin/bash
cd /workspace && python3 -m pytest -q -p no:cacheprovider /tests/test_stats.py
