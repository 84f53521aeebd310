#!/usr/bin/env bash
# MLPerf entry point for SSD300 (ResNet-34): CONFIG=<system> [DATADIR=...] [LOGDIR=...] [NEXP=N]
BENCHMARK=ssd
source "$(dirname "${BASH_SOURCE[0]}")/../../common/run_and_time.sh"
