#!/usr/bin/env bash
# Shared body of every benchmarks/<name>/run_and_time.sh (the MLPerf entry point).
#
# The caller sets BENCHMARK. Environment:
#   CONFIG   system config, benchmarks/<name>/config_${CONFIG}.sh (default cpu_tiny)
#   DATADIR  dataset root; unset: the workload's fixture is generated once and used
#   LOGDIR   where result_<i>.txt logs go (default results/<name>)
#   NEXP     number of runs, each with a fresh seed (default 1)
#   SEED     seed of the first run (default: random); run i uses SEED+i
#   RULESET  compliance ruleset (default 1.1.0)
#   NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT  multi-node rendezvous for torchrun
#   EXTRA_ARGS  more flags for the training program
set -uo pipefail
: "${BENCHMARK:?BENCHMARK must be set by benchmarks/<name>/run_and_time.sh}"
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BENCH_DIR=$REPO/benchmarks/$BENCHMARK
cd "$REPO" || exit 2

die() { echo "run_and_time.sh ($BENCHMARK): error: $*" >&2; exit 2; }

CONFIG=${CONFIG:-cpu_tiny}
config_file=$BENCH_DIR/config_${CONFIG}.sh
if [[ ! -f $config_file ]]; then
    available=$(cd "$BENCH_DIR" && ls config_*.sh | sed 's/^config_//; s/\.sh$//' | tr '\n' ' ')
    die "unknown CONFIG=$CONFIG (no $config_file); available: $available"
fi
NPROC=1
FIXTURE_ARGS=()
TRAIN_ARGS=()
# shellcheck source=/dev/null
source "$config_file"

if [[ -z ${DATADIR:-} ]]; then
    DATADIR=${FIXTURE_DIR:-$REPO/.fixtures/$BENCHMARK}
    python -m "benchmarks.$BENCHMARK.fixture" "$DATADIR" "${FIXTURE_ARGS[@]}" \
        || die "could not write the $BENCHMARK fixture to $DATADIR"
elif [[ ! -d $DATADIR ]]; then
    die "DATADIR=$DATADIR is not a directory: point it at the dataset, or unset it to use the fixture"
elif [[ -z $(ls -A "$DATADIR") ]]; then
    die "DATADIR=$DATADIR is empty: point it at the prepared dataset (see docs/data.md)"
fi

LOGDIR=${LOGDIR:-$REPO/results/$BENCHMARK}
NEXP=${NEXP:-1}
RULESET=${RULESET:-1.1.0}
NNODES=${NNODES:-1}
mkdir -p "$LOGDIR" || die "cannot create LOGDIR=$LOGDIR"
if [[ $NNODES -gt 1 ]]; then
    rdzv=(--nnodes "$NNODES" --node_rank "${NODE_RANK:?NODE_RANK is needed with NNODES>1}"
          --master_addr "${MASTER_ADDR:?MASTER_ADDR is needed with NNODES>1}"
          --master_port "${MASTER_PORT:-29500}")
else
    rdzv=(--standalone)
fi
base_seed=${SEED:-$(( (RANDOM << 15) | RANDOM ))}
read -r -a extra <<< "${EXTRA_ARGS:-}"

failed=0
for ((i = 0; i < NEXP; i++)); do
    seed=$((base_seed + i))
    log=$LOGDIR/result_$i.txt
    echo "== $BENCHMARK run $((i + 1))/$NEXP: CONFIG=$CONFIG seed=$seed log=$log"
    if [[ $NPROC -eq 1 && $NNODES -eq 1 ]]; then
        launch=(python)   # one process needs no launcher (and keeps errors to one line)
    else
        launch=(torchrun "${rdzv[@]}" --nproc_per_node "$NPROC")
    fi
    "${launch[@]}" -m "benchmarks.$BENCHMARK" --data-dir "$DATADIR" --seed "$seed" \
        --log-file "$log" "${TRAIN_ARGS[@]}" "${extra[@]}"
    train_rc=$?
    # 2: bad input, already reported in one line by the program; no run to check.
    [[ $train_rc -eq 2 ]] && exit 2
    if [[ ! -s $log ]]; then
        echo "run_and_time.sh ($BENCHMARK): run $i wrote no log (exit $train_rc)" >&2
        failed=1
        continue
    fi
    python -m compliance.check --ruleset "$RULESET" "$log" || failed=1
    python -m compliance.result "$log" || failed=1
    [[ $train_rc -eq 0 ]] || failed=1
done
exit $failed
