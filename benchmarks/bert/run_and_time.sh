#!/usr/bin/env bash
# MLPerf entry point for BERT-large: CONFIG=<system> [DATADIR=...] [LOGDIR=...] [NEXP=N]
BENCHMARK=bert
source "$(dirname "${BASH_SOURCE[0]}")/../../common/run_and_time.sh"
