#!/usr/bin/env bash
# MLPerf entry point for ResNet-50 v1.5: CONFIG=<system> [DATADIR=...] [LOGDIR=...] [NEXP=N]
BENCHMARK=resnet
source "$(dirname "${BASH_SOURCE[0]}")/../../common/run_and_time.sh"
