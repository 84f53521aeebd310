#!/usr/bin/env bash
# MLPerf entry point for Mask R-CNN (R50-FPN): CONFIG=<system> [DATADIR=...] [LOGDIR=...] [NEXP=N]
BENCHMARK=maskrcnn
source "$(dirname "${BASH_SOURCE[0]}")/../../common/run_and_time.sh"
