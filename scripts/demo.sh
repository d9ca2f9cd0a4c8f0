#!/usr/bin/env bash
# The main job (README, Benchmarks): sets up .venv (the py311 leg of scripts/_env.sh) if
# needed, then runs the benchmark suite's default. Extra arguments go to the suite (see:
# .venv/bin/python benchmarks/suite.py --help).
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
exec "$PY" benchmarks/suite.py "$@"
