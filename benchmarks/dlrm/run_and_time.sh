#!/usr/bin/env bash
# MLPerf entry point for DLRM: CONFIG=<system> [DATADIR=...] [LOGDIR=...] [NEXP=N]
BENCHMARK=dlrm
source "$(dirname "${BASH_SOURCE[0]}")/../../common/run_and_time.sh"
