#!/usr/bin/env bash
# MLPerf entry point for the 3D U-Net: CONFIG=<system> [DATADIR=...] [LOGDIR=...] [NEXP=N]
BENCHMARK=unet3d
source "$(dirname "${BASH_SOURCE[0]}")/../../common/run_and_time.sh"
