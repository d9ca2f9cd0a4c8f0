#!/usr/bin/env bash
# The test command (README, CI): sets up .venv if needed, then runs every test,
# the slow and the XLA ones included (torch-xla on its CPU backend), and requires the
# CPU step's C kernels to have been built.
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
export NEURON_SIFT_REQUIRE_XLA=1
export NEURON_SIFT_REQUIRE_HOST_KERNELS=1
exec .venv/bin/python -m pytest "$@"
