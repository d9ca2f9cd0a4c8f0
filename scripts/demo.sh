#!/usr/bin/env bash
# The main job (README): sets up .venv if needed, then trains a small model with and
# without sifting on CPU and prints kept share, time and accuracy per arm.
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
exec .venv/bin/python benchmarks/demo.py "$@"
