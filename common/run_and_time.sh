#!/usr/bin/env bash
# Shared body of every benchmarks/<name>/run_and_time.sh (the MLPerf entry point).
#
# The caller sets BENCHMARK. Environment (each checked before anything runs: a bad value
# stops the script with one line and exit 2):
#   CONFIG   system config, benchmarks/<name>/config_${CONFIG}.sh (default cpu_tiny): it sets
#            NPROC, OPTIMISATIONS (optimisation names, `--list-optimisations`), TRAIN_ARGS
#            (the hyper-parameters that differ from the reference, and run flags)
#   DATADIR  dataset root; unset: the workload's fixture is generated once (FIXTURE_DIR, default
#            .fixtures/<name>) and used
#   LOGDIR   where result_<i>.txt logs go (default results/<name>); earlier result_*.txt
#            there are moved to LOGDIR/previous-<UTC time>/ first
#   NEXP     number of runs (a positive integer), each with a fresh seed (default 1)
#   SEED     seed of the first run, 0 to 2^31-1 (default: random); run i uses SEED+i
#   RULESET  compliance ruleset, one that mlperf_logging ships (default 1.1.0)
#   GPUS     processes (GPUs) per node instead of the config's NPROC, e.g. the 8xH200 config
#            on the GPUs a machine has; per-GPU batch sizes stay, so the global batch changes
#   NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT  multi-node rendezvous for torchrun; inside a
#            SLURM job of several nodes (one task per node) they default to SLURM's
#            (SLURM_NNODES, SLURM_NODEID, the first host of SLURM_JOB_NODELIST): docs/slurm.md
#   COLLECTIVE_TIMEOUT_S  seconds a collective waits for its peers (default 300, common/dist.py)
#   STOP_GRACE_S  seconds a stopped run has to end before it is killed with the processes it
#            started (default 60)
#   EXTRA_ARGS  more flags for the training program (started as python -m common.entry)
#   DRY_RUN  STEPS (a positive integer): each run a dry run of the config as written (--dry-run
#            STEPS: STEPS timed training steps and one full evaluation, common/dry_run.py), its
#            log no result; its projected time-to-train (compliance.projection) instead of the
#            compliance check and the RESULT line
# A variable set but empty is refused where it names a path (DATADIR, FIXTURE_DIR, LOGDIR) and
# taken as unset otherwise.
# SIGINT/SIGTERM, at any moment, stop the current run (its log, if it began one, ends with
# run_stop aborted and is still checked; node 0 prints its RESULT line either way, run 1's
# where the signal came before it began), start no further run and exit 128 + the signal's
# number.
set -uo pipefail
: "${BENCHMARK:?BENCHMARK must be set by benchmarks/<name>/run_and_time.sh}"
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BENCH_DIR=$REPO/benchmarks/$BENCHMARK
cd "$REPO" || exit 2

die() { echo "run_and_time.sh ($BENCHMARK): error: $*" >&2; exit 2; }

# The programs this script starts (the fixture writer, the training program) end on SIGINT
# and SIGTERM; the training program logs run_stop aborted. A signal sent to this script alone
# is forwarded to the running one; one sent to the process group (Ctrl-C) reaches it directly
# as well. Only the first signal is forwarded: the program ignores repeats while it shuts down.
child=            # pid of the running program
stop_name=        # first signal received
stop_signal=0
interrupted=0     # a trap ran since the last wait began
watchdog=         # pid of the subshell that kills a stopped run not ended in time
on_signal() {
    interrupted=1
    [[ -z $stop_name ]] || return 0
    stop_name=$1
    stop_signal=$2
    echo "run_and_time.sh ($BENCHMARK): SIG$1: stopping the current run, no further runs" >&2
    if [[ -n $child ]] && kill -0 "$child" 2>/dev/null; then
        kill -s "$1" "$child"
        start_watchdog "$1"
    fi
}

# Kills process $1 and every process below it (stopped first, so that it starts no other).
kill_tree() {
    local c
    kill -STOP "$1" 2>/dev/null
    for c in $(pgrep -P "$1"); do kill_tree "$c"; done
    kill -KILL "$1" 2>/dev/null
}

# A stopped program runs its handler only where Python code runs: one stuck in native code (a
# compiler, a device call) would hold the script for good. It has STOP_GRACE_S to end; then it
# is killed with what it started, its log left without run_stop.
start_watchdog() {
    local target=$child
    (
        trap '' INT TERM   # a signal to the whole group must not end the watch
        local end=$((SECONDS + STOP_GRACE_S))
        while ((SECONDS < end)); do sleep 1; done
        kill -0 "$target" 2>/dev/null || exit 0
        echo "run_and_time.sh ($BENCHMARK): the run did not end within STOP_GRACE_S=$STOP_GRACE_S s of SIG$1: killed" >&2
        kill_tree "$target"
    ) &
    watchdog=$!
}
trap 'on_signal INT 2' INT
trap 'on_signal TERM 15' TERM

# The RESULT line of a run stopped or failed before its log began (seed $1).
result_without_log() { echo "RESULT,$BENCHMARK,$1,nan,aborted,unknown,eval_accuracy=none"; }

# A stop before the first run began (while checking, writing the fixture): no run to
# check; run 1's RESULT line says aborted.
stop_before_run() {
    [[ -z $stop_name ]] && return
    [[ ${NODE_RANK:-0} != 0 ]] || result_without_log "$base_seed"
    exit $((128 + stop_signal))
}

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
# A non-negative decimal integer of at most 9 digits (no overflow in bash's arithmetic), as a
# decimal number (bash would read 08 as a bad octal number) in $REPLY.
small_int() {
    [[ ${!1} =~ ^[0-9]{1,9}$ ]] || return 1
    REPLY=$((10#${!1}))
}
for name in DATADIR FIXTURE_DIR LOGDIR; do
    [[ -v $name && -z ${!name} ]] \
        && die "$name is set but empty: set it to a folder, or unset it for the default"
done
if [[ -n ${GPUS:-} ]]; then
    small_int GPUS && ((REPLY > 0)) \
        || die "GPUS=$GPUS is not a positive integer: set GPUS to the GPUs per node, e.g. GPUS=2"
    NPROC=$REPLY
fi
NEXP=${NEXP:-1}
small_int NEXP && ((REPLY > 0)) \
    || die "NEXP=$NEXP is not a positive integer below 10^9: set NEXP to the number of runs, e.g. NEXP=5"
NEXP=$REPLY
MAX_SEED=$(( (1 << 31) - 1 ))
if [[ -n ${SEED:-} ]]; then
    small_int SEED || [[ $SEED =~ ^[0-9]{10}$ ]] \
        || die "SEED=$SEED is not an integer from 0 to $MAX_SEED: set SEED to one, or unset it for a random seed"
    base_seed=$((10#$SEED))
    ((base_seed + NEXP - 1 <= MAX_SEED)) \
        || die "SEED=$SEED: run $NEXP would use seed $((base_seed + NEXP - 1)), above $MAX_SEED: lower SEED or NEXP"
else
    base_seed=$(( ((RANDOM << 15) | RANDOM) % (MAX_SEED - NEXP + 2) ))
fi
dry=()
if [[ -n ${DRY_RUN:-} ]]; then
    small_int DRY_RUN && ((REPLY > 0)) \
        || die "DRY_RUN=$DRY_RUN is not a positive integer: set it to the training steps to time, e.g. DRY_RUN=200, or unset it"
    dry=(--dry-run "$REPLY")
fi
STOP_GRACE_S=${STOP_GRACE_S:-60}
small_int STOP_GRACE_S && ((REPLY > 0)) \
    || die "STOP_GRACE_S=$STOP_GRACE_S is not a positive integer: set it to the seconds a stopped run may take to end, e.g. STOP_GRACE_S=60"
STOP_GRACE_S=$REPLY
if [[ -n ${COLLECTIVE_TIMEOUT_S:-} ]]; then
    small_int COLLECTIVE_TIMEOUT_S && ((REPLY > 0)) \
        || die "COLLECTIVE_TIMEOUT_S=$COLLECTIVE_TIMEOUT_S is not a positive integer: set it to the seconds a collective may wait for its peers"
fi
# Inside a SLURM job of several nodes, one task per node runs this script (docs/slurm.md).
rank_name=NODE_RANK   # the variable NODE_RANK came from, for the messages
slurm_nodes=1
if [[ -z ${NNODES:-} && -n ${SLURM_NNODES:-} ]]; then
    small_int SLURM_NNODES && ((REPLY > 0)) \
        || die "SLURM_NNODES=$SLURM_NNODES is not a positive integer: set NNODES (and NODE_RANK, MASTER_ADDR) instead"
    slurm_nodes=$REPLY
fi
if ((slurm_nodes > 1)); then
    [[ ${SLURM_NTASKS:-$SLURM_NNODES} == "$SLURM_NNODES" ]] \
        || die "SLURM_NTASKS=$SLURM_NTASKS on SLURM_NNODES=$SLURM_NNODES nodes: run one task per node (srun --ntasks-per-node=1), torchrun starts the processes of each"
    NNODES=$slurm_nodes
    if [[ -z ${NODE_RANK:-} ]]; then
        [[ -n ${SLURM_NODEID:-} ]] \
            || die "SLURM_NNODES=$SLURM_NNODES without SLURM_NODEID: run this script with srun, or set NODE_RANK"
        NODE_RANK=$SLURM_NODEID
        rank_name=SLURM_NODEID
    fi
    if [[ -z ${MASTER_ADDR:-} && -n ${SLURM_JOB_NODELIST:-} ]]; then
        MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" 2>/dev/null | head -n 1)
    fi
fi
NNODES=${NNODES:-1}
small_int NNODES && ((REPLY > 0)) \
    || die "NNODES=$NNODES is not a positive integer: set NNODES to the number of nodes, e.g. NNODES=2"
NNODES=$REPLY
if ((NNODES > 1)); then
    [[ -n ${NODE_RANK:-} ]] || die "NNODES=$NNODES needs NODE_RANK, this node's index from 0 to $((NNODES - 1))"
    [[ -n ${MASTER_ADDR:-} ]] || die "NNODES=$NNODES needs MASTER_ADDR, the address of node 0"
fi
if [[ -n ${NODE_RANK:-} ]]; then
    small_int NODE_RANK && ((REPLY < NNODES)) \
        || die "$rank_name=$NODE_RANK is not a node index from 0 to $((NNODES - 1)) (NNODES=$NNODES)"
    NODE_RANK=$REPLY
fi
MASTER_PORT=${MASTER_PORT:-29500}
small_int MASTER_PORT && ((REPLY > 0 && REPLY < 65536)) \
    || die "MASTER_PORT=$MASTER_PORT is not a port number (1 to 65535)"
RULESET=${RULESET:-1.1.0}
# (a Ctrl-C meanwhile ends the lister too: its traceback is no news)
rulesets=$(python -c 'from mlperf_logging.compliance_checker import mlp_compliance as m
print(" ".join(sorted(m.rule_choices(), key=lambda v: tuple(map(int, v.split("."))))))' \
           2>/dev/null)
listed=$?
stop_before_run
((listed == 0)) \
    || die "cannot list the compliance rulesets of mlperf_logging: install the suite (make venv)"
[[ " $rulesets " == *" $RULESET "* ]] \
    || die "RULESET=$RULESET is not a training ruleset of mlperf_logging: choose one of $rulesets"
LOGDIR=${LOGDIR:-$REPO/results/$BENCHMARK}
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

read -r -a extra <<< "${EXTRA_ARGS:-}"
if ((${#OPTIMISATIONS[@]})); then
    OPTIMISE=(--optimisations "$(IFS=,; echo "${OPTIMISATIONS[*]}")")
else
    OPTIMISE=()
fi
if ((NPROC == 1 && NNODES == 1)); then
    launch=(python)   # one process needs no launcher
else   # torchrun, exiting with its workers' verdict (2: bad input, 128+N: stopped)
    if ((NNODES > 1)); then
        rdzv=(--nnodes "$NNODES" --node_rank "$NODE_RANK" --master_addr "$MASTER_ADDR"
              --master_port "$MASTER_PORT")
    else
        rdzv=(--standalone)
    fi
    launch=(python -m common.launch "${rdzv[@]}" --nproc_per_node "$NPROC")
fi

# Sets child_rc to the exit status of $child. A trapped signal ends `wait` early (status 128+n)
# while the child may still be shutting down: wait again until it has exited. Bash keeps the
# status of a child it reaped meanwhile; 127 means the interrupted wait had already taken it.
wait_child() {
    local rc later
    while :; do
        interrupted=0
        wait "$child" 2>/dev/null   # (no "Killed" notice: the watchdog says why)
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
    child_rc=$rc
    if [[ -n $watchdog ]]; then   # the run ended in time (or was killed): no watch left
        kill_tree "$watchdog"
        wait "$watchdog" 2>/dev/null
        watchdog=
    fi
}

# Runs "$@" to its end, its status in child_rc. In the background, so that the traps run while
# it works (a foreground child delays them), with SIGINT's default action: bash starts a
# background job with SIGINT ignored (and cannot undo it where this script started so), where
# a Ctrl-C before the program has installed its own handler would be lost.
run_child() {
    env --default-signal=INT "$@" &
    child=$!
    # a signal between the launch and the line above found no child to forward to
    [[ -z $stop_name ]] || kill -s "$stop_name" "$child" 2>/dev/null
    wait_child
}

# 130/143: the program was stopped by SIGINT/SIGTERM. Stop here too, even where this script's
# own trap did not run: a shell started with SIGINT ignored (a background job of a
# non-interactive shell) cannot trap it, while the program can.
note_stop() {
    if [[ -z $stop_name ]] && ((child_rc == 130 || child_rc == 143)); then
        stop_name=$([[ $child_rc -eq 130 ]] && echo INT || echo TERM)
        stop_signal=$((child_rc - 128))
        echo "run_and_time.sh ($BENCHMARK): the run was stopped by SIG$stop_name: no further runs" >&2
    fi
}

# A run ended by a signal this script did not pass on (exit 128+N): killed from outside or
# crashed. Its log ends without run_stop; say so and why it may have happened.
note_killed() {
    if [[ -z $stop_name ]] && ((child_rc > 128 && child_rc < 160)); then
        echo "run_and_time.sh ($BENCHMARK): run $1 ended by SIG$(kill -l $((child_rc - 128))) (exit $child_rc) before it could log run_stop: KILL is most often the kernel's out-of-memory killer (see dmesg or the container's memory limit); SEGV, BUS or ABRT is a crash, its stack printed above" >&2
    fi
}

if [[ -z ${DATADIR:-} ]]; then
    DATADIR=${FIXTURE_DIR:-$REPO/.fixtures/$BENCHMARK}
    run_child python -m "benchmarks.$BENCHMARK.fixture" "$DATADIR" "${FIXTURE_ARGS[@]}"
    note_stop
    stop_before_run
    # The writer says why it wrote nothing in one line (2: refused, 128+N: stopped by signal N).
    ((child_rc == 0)) || exit $child_rc
elif [[ ! -d $DATADIR ]]; then
    die "DATADIR=$DATADIR is not a directory: point it at the dataset (see docs/data.md#$BENCHMARK), or unset it to use the fixture"
elif ! entries=$(ls -A "$DATADIR" 2>/dev/null); then
    die "DATADIR=$DATADIR cannot be read: make it readable (chmod u+rx $DATADIR) or point DATADIR at the dataset"
elif [[ -z $entries ]]; then
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

failed=0
for ((i = 0; i < NEXP; i++)); do
    seed=$((base_seed + i))
    log=$LOGDIR/result_$i.txt
    echo "== $BENCHMARK run $((i + 1))/$NEXP: CONFIG=$CONFIG seed=$seed log=$log"
    # common.entry: SIGINT ends the program until its handler is installed (Python's own would
    # raise KeyboardInterrupt inside whatever library it is importing)
    run_child "${launch[@]}" -m common.entry "benchmarks.$BENCHMARK" --data-dir "$DATADIR" \
        --seed "$seed" --log-file "$log" "${OPTIMISE[@]}" "${TRAIN_ARGS[@]}" "${extra[@]}" \
        "${dry[@]}"
    note_stop
    note_killed $((i + 1))
    # 2: bad input, already reported in one line; no run to check (a stop signal wins).
    [[ -z $stop_name ]] && ((child_rc == 2)) && exit 2
    if [[ ${NODE_RANK:-0} != 0 ]]; then   # global rank 0, on node 0, writes the log
        ((child_rc == 0)) || failed=1
    elif [[ -s $log && ${#dry[@]} -gt 0 ]]; then   # a dry run: a projection, no verdict
        ((child_rc == 0)) || failed=1
        ((child_rc == 0)) && { env --ignore-signal=INT python -m compliance.projection \
            --ruleset "$RULESET" "$log" || failed=1; }
    elif [[ -s $log ]]; then
        # a Ctrl-C now lets the check of the finished log end (seconds): its verdict is owed
        env --ignore-signal=INT python -m compliance.check --ruleset "$RULESET" "$log" \
            || failed=1
        env --ignore-signal=INT python -m compliance.result --seed "$seed" "$log" || failed=1
        ((child_rc == 0)) || failed=1
    else   # stopped or failed before its log began
        echo "run_and_time.sh ($BENCHMARK): run $((i + 1)) wrote no log (exit $child_rc)" >&2
        result_without_log "$seed"
        failed=1
    fi
    [[ -z $stop_name ]] || exit $((128 + stop_signal))
done
exit $failed
