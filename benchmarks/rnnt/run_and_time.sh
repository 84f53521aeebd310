#!/usr/bin/env bash
# MLPerf entry point for RNN-T: CONFIG=<system> [DATADIR=...] [LOGDIR=...] [NEXP=N]
BENCHMARK=rnnt
source "$(dirname "${BASH_SOURCE[0]}")/../../common/run_and_time.sh"
