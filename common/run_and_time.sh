#!/usr/bin/env bash
# Shared body of every benchmarks/<name>/run_and_time.sh (the MLPerf entry point).
#
# The caller sets BENCHMARK. Environment:
#   CONFIG   system config, benchmarks/<name>/config_${CONFIG}.sh (default cpu_tiny): it sets
#            NPROC, OPTIMISATIONS (optimisation names, `--list-optimisations`), TRAIN_ARGS
#            (the hyper-parameters that differ from the reference, and run flags)
#   DATADIR  dataset root; unset: the workload's fixture is generated once and used
#   LOGDIR   where result_<i>.txt logs go (default results/<name>); earlier result_*.txt
#            there are moved to LOGDIR/previous-<UTC time>/ first
#   NEXP     number of runs (a positive integer), each with a fresh seed (default 1)
#   SEED     seed of the first run (default: random); run i uses SEED+i
#   RULESET  compliance ruleset (default 1.1.0)
#   GPUS     processes (GPUs) per node instead of the config's NPROC, e.g. the 8xH200 config
#            on the GPUs a machine has; per-GPU batch sizes stay, so the global batch changes
#   NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT  multi-node rendezvous for torchrun
#   EXTRA_ARGS  more flags for the training program
# SIGINT/SIGTERM stop the current run (still checked, its RESULT line printed), start no
# further run and exit 128 + the signal's number.
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
OPTIMISATIONS=()
TRAIN_ARGS=()
# shellcheck source=/dev/null
source "$config_file"
if [[ -n ${GPUS:-} ]]; then
    [[ $GPUS =~ ^[1-9][0-9]*$ ]] || die "GPUS=$GPUS is not a positive integer: set GPUS to the GPUs per node, e.g. GPUS=2"
    NPROC=$GPUS
fi

NEXP=${NEXP:-1}
[[ $NEXP =~ ^[0-9]+$ ]] && ((10#$NEXP > 0)) \
    || die "NEXP=$NEXP is not a positive integer: set NEXP to the number of runs, e.g. NEXP=5"
NEXP=$((10#$NEXP))   # bash arithmetic would read 08 as a bad octal number
LOGDIR=${LOGDIR:-$REPO/results/$BENCHMARK}
RULESET=${RULESET:-1.1.0}
NNODES=${NNODES:-1}
# Checked before the fixture and the runs, which would otherwise fail only when writing the log.
# -w holds for root whatever the mode bits, and on sysfs, which refuses new files anyway: a probe
# file settles it.
[[ -e $LOGDIR && ! -d $LOGDIR ]] && die "LOGDIR=$LOGDIR is not a directory: point LOGDIR at one"
mkdir -p "$LOGDIR" 2>/dev/null \
    || die "cannot create LOGDIR=$LOGDIR: point LOGDIR at a writable directory"
probe=
[[ -w $LOGDIR ]] && probe=$(mktemp "$LOGDIR/.write-test.XXXXXX" 2>/dev/null)
[[ -n $probe ]] || die "LOGDIR=$LOGDIR is not writable: point LOGDIR at a writable directory"
rm -f "$probe"

if [[ -z ${DATADIR:-} ]]; then
    DATADIR=${FIXTURE_DIR:-$REPO/.fixtures/$BENCHMARK}
    # The writer says why it wrote nothing in one line (2: refused, 128+N: stopped by signal N).
    python -m "benchmarks.$BENCHMARK.fixture" "$DATADIR" "${FIXTURE_ARGS[@]}" || exit
elif [[ ! -d $DATADIR ]]; then
    die "DATADIR=$DATADIR is not a directory: point it at the dataset (see docs/data.md#$BENCHMARK), or unset it to use the fixture"
elif [[ -z $(ls -A "$DATADIR") ]]; then
    die "DATADIR=$DATADIR is empty: point it at the prepared dataset (see docs/data.md#$BENCHMARK)"
fi

# Logs of an earlier invocation (perhaps with a larger NEXP) would sit beside this one's and be
# packaged with them: move them aside. Only node 0 does it, as only global rank 0 writes logs.
shopt -s nullglob
earlier=("$LOGDIR"/result_*.txt)
shopt -u nullglob
if [[ ${NODE_RANK:-0} == 0 && ${#earlier[@]} -gt 0 ]]; then
    stamp=$(date -u +%Y%m%dT%H%M%SZ)
    aside=$LOGDIR/previous-$stamp
    for ((n = 1; ; n++)); do [[ -e $aside ]] || break; aside=$LOGDIR/previous-$stamp-$n; done
    { mkdir "$aside" && mv "${earlier[@]}" "$aside/"; } 2>/dev/null \
        || die "cannot move the earlier result_*.txt of LOGDIR=$LOGDIR aside: move them by hand"
    echo "run_and_time.sh ($BENCHMARK): moved ${#earlier[@]} earlier result_*.txt" \
        "from $LOGDIR to $aside"
fi
if [[ $NNODES -gt 1 ]]; then
    rdzv=(--nnodes "$NNODES" --node_rank "${NODE_RANK:?NODE_RANK is needed with NNODES>1}"
          --master_addr "${MASTER_ADDR:?MASTER_ADDR is needed with NNODES>1}"
          --master_port "${MASTER_PORT:-29500}")
else
    rdzv=(--standalone)
fi
base_seed=${SEED:-$(( (RANDOM << 15) | RANDOM ))}
read -r -a extra <<< "${EXTRA_ARGS:-}"
if ((${#OPTIMISATIONS[@]})); then
    OPTIMISE=(--optimisations "$(IFS=,; echo "${OPTIMISATIONS[*]}")")
else
    OPTIMISE=()
fi

# The training program logs run_stop aborted on SIGINT/SIGTERM. A signal sent to this script
# alone is forwarded to it; one sent to the process group (Ctrl-C) reaches it directly as well.
# Only the first signal is forwarded: the program ignores repeats while it shuts down.
child=            # pid of the running training program
stop_name=        # first signal received
stop_signal=0
interrupted=0     # a trap ran since the last wait began
on_signal() {
    interrupted=1
    [[ -z $stop_name ]] || return 0
    stop_name=$1
    stop_signal=$2
    echo "run_and_time.sh ($BENCHMARK): SIG$1: stopping the current run, no further runs" >&2
    if [[ -n $child ]] && kill -0 "$child" 2>/dev/null; then
        kill -s "$1" "$child"
    fi
}
trap 'on_signal INT 2' INT
trap 'on_signal TERM 15' TERM

# Sets train_rc to the exit status of $child. A trapped signal ends `wait` early (status 128+n)
# while the child may still be shutting down: wait again until it has exited. Bash keeps the
# status of a child it reaped meanwhile; 127 means the interrupted wait had already taken it.
wait_child() {
    local rc later
    while :; do
        interrupted=0
        wait "$child"
        rc=$?
        ((interrupted)) || break
        if ! kill -0 "$child" 2>/dev/null; then
            wait "$child" 2>/dev/null
            later=$?
            ((later == 127)) || rc=$later
            break
        fi
    done
    child=
    train_rc=$rc
}

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
    # In the background, so that the traps run while it trains (a foreground child delays them).
    "${launch[@]}" -m "benchmarks.$BENCHMARK" --data-dir "$DATADIR" --seed "$seed" \
        --log-file "$log" "${OPTIMISE[@]}" "${TRAIN_ARGS[@]}" "${extra[@]}" &
    child=$!
    # a signal between the launch and the line above found no child to forward to
    [[ -z $stop_name ]] || kill -s "$stop_name" "$child" 2>/dev/null
    wait_child
    # 130/143: the program was stopped by SIGINT/SIGTERM (its run_stop says aborted). Stop here
    # too, even where this script's own trap did not run: a shell started with SIGINT ignored
    # (a background job of a non-interactive shell) cannot trap it, while the program can.
    if [[ -z $stop_name ]] && ((train_rc == 130 || train_rc == 143)); then
        stop_name=$([[ $train_rc -eq 130 ]] && echo INT || echo TERM)
        stop_signal=$((train_rc - 128))
        echo "run_and_time.sh ($BENCHMARK): the run was stopped by SIG$stop_name: no further runs" >&2
    fi
    # 2: bad input, already reported in one line by the program; no run to check.
    [[ $train_rc -eq 2 ]] && exit 2
    if [[ -s $log ]]; then
        python -m compliance.check --ruleset "$RULESET" "$log" || failed=1
        python -m compliance.result "$log" || failed=1
        [[ $train_rc -eq 0 ]] || failed=1
    else
        echo "run_and_time.sh ($BENCHMARK): run $i wrote no log (exit $train_rc)" >&2
        failed=1
    fi
    [[ -z $stop_name ]] || exit $((128 + stop_signal))
done
exit $failed
