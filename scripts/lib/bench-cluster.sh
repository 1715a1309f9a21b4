# shellcheck shell=bash
# Starting and stopping the clusters the bench-*.sh scripts compare, and running their
# rounds. Sourced, never run: the caller sets `set -euo pipefail` and defines
#   bench SYSTEM ROUND: benchmark $ENDPOINTS (the running SYSTEM) for round ROUND; the
#     script keeps what it wants under $WORK.
# then calls `setup_bench_cluster NAME` and `run_rounds`.
#
# Systems: `etcd` (3 members of etcd 3.4 on 127.0.0.1 ports 14379/14380, 24379/24380,
# 34379/34380; fsync on, as etcd does by default), `oncekv` (`oncekv dev`: 3 members in
# one process, fsync on), and `baseline` (`oncekv dev` of the binary BASELINE_BIN, e.g. one
# built at an older commit). The benchmark client is always this tree's `oncekv`, so both
# systems of a comparison meet the same load generator.
#
# Environment:
#   COMPARE [etcd]: the system oncekv is compared with (etcd or baseline).
#   BASELINE_BIN: the oncekv binary of the baseline system (needed with COMPARE=baseline).
#   ROUNDS [2]: odd rounds run $COMPARE first, even rounds oncekv first, each from empty
#     data directories.
#   KEEP=1 keeps the temporary directory (logs, per-run results) for inspection.
#   ONCEKV_BIN=path: use this oncekv binary instead of building one.
#   ONCEKV_DEV_ARGS="...": extra flags for `oncekv dev` (both oncekv and baseline).

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/tmp/cargo-target}
ROUNDS=${ROUNDS:-2}
COMPARE=${COMPARE:-etcd}
SERVER_PIDS=()
ENDPOINTS=""

# setup_bench_cluster NAME: checks the tools, makes $WORK, builds (or finds) $BIN.
setup_bench_cluster() {
    SCRIPT_NAME=$1
    case $COMPARE in
    etcd)
        for tool in etcd etcdctl; do
            if ! command -v "$tool" >/dev/null; then
                echo "$SCRIPT_NAME: $tool not found (.ci/install-deps installs it)" >&2
                exit 1
            fi
        done
        ;;
    baseline)
        if [[ ! -x ${BASELINE_BIN:-} ]]; then
            echo "$SCRIPT_NAME: COMPARE=baseline needs BASELINE_BIN=<an oncekv binary>" >&2
            exit 1
        fi
        ;;
    *)
        echo "$SCRIPT_NAME: COMPARE=$COMPARE: expected etcd or baseline" >&2
        exit 1
        ;;
    esac
    WORK=$(mktemp -d "${TMPDIR:-/tmp}/$SCRIPT_NAME.XXXXXX")
    trap cleanup EXIT
    trap 'exit 130' INT TERM
    if [[ -n ${ONCEKV_BIN:-} ]]; then
        BIN=$ONCEKV_BIN
    else
        log "building oncekv (release)"
        cargo build --release --quiet -p oncekv --manifest-path "$ROOT/Cargo.toml"
        BIN=$CARGO_TARGET_DIR/release/oncekv
    fi
    if [[ $COMPARE == etcd ]]; then
        log "etcd $(etcd --version | head -n 1 | awk '{ print $3 }'), $(nproc) CPUs, $ROUNDS rounds"
    else
        log "baseline $BASELINE_BIN, $(nproc) CPUs, $ROUNDS rounds"
    fi
}

log() { echo "$SCRIPT_NAME: $*" >&2; }

# Stops the running servers: SIGINT (both shut down cleanly on it), SIGKILL after 10 s.
stop_servers() {
    local pid
    for pid in "${SERVER_PIDS[@]}"; do
        kill -INT "$pid" 2>/dev/null || true
    done
    for pid in "${SERVER_PIDS[@]}"; do
        for _ in $(seq 100); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    SERVER_PIDS=()
}

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    stop_servers
    if [[ ${KEEP:-0} == 1 ]]; then
        log "kept $WORK"
    else
        rm -rf "$WORK"
    fi
    exit "$rc"
}

# Total CPU seconds (user + system) used so far by the given processes.
CLK_TCK=$(getconf CLK_TCK)
cpu_seconds() {
    local total=0 pid t
    for pid in "$@"; do
        # Fields 14 and 15 of /proc/PID/stat, counted after the "(command name) ".
        t=$(awk '{ sub(/.*\) /, ""); print $12 + $13 }' "/proc/$pid/stat" 2>/dev/null || echo 0)
        total=$((total + t))
    done
    awk -v t="$total" -v hz="$CLK_TCK" 'BEGIN { printf "%.2f", t / hz }'
}

# json_field FILE KEY: the first number named KEY in the (one-line) JSON summary of
# `oncekv bench`.
json_field() {
    grep -o "\"$2\":[0-9.]*" "$1" | head -n 1 | cut -d: -f2
}

# An awk function for the summaries: field(FILE, KEY), the first number named KEY in the
# one-line JSON FILE (0 if none).
# shellcheck disable=SC2016 # awk code, expanded by awk
AWK_FIELD='function field(file, key,   line, re) {
    getline line < file; close(file)
    re = "\"" key "\":[0-9.]+"
    if (match(line, re)) return substr(line, RSTART + length(key) + 3, RLENGTH - length(key) - 3) + 0
    return 0
}'

# run_timed OUT CMD...: runs the benchmark client CMD; OUT.json gets its summary,
# OUT.progress its stderr, OUT.client-cpu its CPU seconds, OUT.server-cpu the servers' CPU
# seconds meanwhile and OUT.load the load average before it. Exits the script if it fails.
run_timed() {
    local out=$1 before after status=0
    shift
    awk '{ print $1 }' /proc/loadavg >"$out.load"
    before=$(cpu_seconds "${SERVER_PIDS[@]}")
    /usr/bin/time -f "%U %S" -o "$out.client-cpu" "$@" >"$out.json" 2>"$out.progress" || status=$?
    after=$(cpu_seconds "${SERVER_PIDS[@]}")
    awk -v a="$after" -v b="$before" 'BEGIN { printf "%.2f", a - b }' >"$out.server-cpu"
    awk '{ printf "%.2f", $1 + $2 }' "$out.client-cpu" >"$out.client-cpu-total"
    sed 's/^/    /' "$out.progress" >&2
    if [[ $status -ne 0 ]]; then
        log "$(basename "$out"): the benchmark failed (exit $status)"
        cat "$out.json" >&2 || true
        exit "$status"
    fi
}

start_etcd() { # start_etcd DIR
    local dir=$1 cluster="" i attempt pid
    ENDPOINTS=""
    for i in 1 2 3; do
        cluster+="${cluster:+,}e$i=http://127.0.0.1:${i}4380"
        ENDPOINTS+="${ENDPOINTS:+,}127.0.0.1:${i}4379"
    done
    mkdir -p "$dir"
    for i in 1 2 3; do
        etcd --name "e$i" --data-dir "$dir/e$i" \
            --listen-client-urls "http://127.0.0.1:${i}4379" \
            --advertise-client-urls "http://127.0.0.1:${i}4379" \
            --listen-peer-urls "http://127.0.0.1:${i}4380" \
            --initial-advertise-peer-urls "http://127.0.0.1:${i}4380" \
            --initial-cluster "$cluster" --initial-cluster-token bench-vs-etcd \
            --initial-cluster-state new \
            --logger zap --log-outputs stderr >"$dir/e$i.log" 2>&1 &
        SERVER_PIDS+=($!)
    done
    for attempt in $(seq 150); do
        if ETCDCTL_API=3 etcdctl --endpoints "$ENDPOINTS" --command-timeout 2s \
            endpoint health >/dev/null 2>&1; then
            return 0
        fi
        for pid in "${SERVER_PIDS[@]}"; do
            if ! kill -0 "$pid" 2>/dev/null; then
                log "etcd exited early; its logs:"
                tail -n 20 "$dir"/e*.log >&2
                exit 1
            fi
        done
        if [[ $attempt == 150 ]]; then
            log "etcd did not become healthy within 30 s; its logs:"
            tail -n 20 "$dir"/e*.log >&2
            exit 1
        fi
        sleep 0.2
    done
}

start_oncekv() { # start_oncekv DIR [BINARY]
    local dir=$1 bin=${2:-$BIN} attempt
    mkdir -p "$dir"
    # shellcheck disable=SC2086 # ONCEKV_DEV_ARGS is a list of flags
    "$bin" dev --data-dir "$dir/data" ${ONCEKV_DEV_ARGS:-} >"$dir/out" 2>"$dir/log" &
    SERVER_PIDS+=($!)
    for attempt in $(seq 300); do
        grep -q ready "$dir/out" 2>/dev/null && break
        if [[ $attempt == 300 ]] || ! kill -0 "${SERVER_PIDS[0]}" 2>/dev/null; then
            log "oncekv dev did not become ready; its output:"
            cat "$dir/out" >&2
            tail -n 20 "$dir/log" >&2
            exit 1
        fi
        sleep 0.1
    done
    # The dev cluster prints "  n1: clients http://127.0.0.1:2379  peers ..." per member
    # (it falls back to other ports when the defaults are taken).
    ENDPOINTS=$(sed -n 's/^ *n[0-9]*: clients http:\/\/\([^ ]*\) .*/\1/p' "$dir/out" | paste -sd, -)
    if [[ -z $ENDPOINTS ]]; then
        log "cannot find the client endpoints in the output of oncekv dev:"
        cat "$dir/out" >&2
        exit 1
    fi
}

start_baseline() { # start_baseline DIR
    start_oncekv "$1" "$BASELINE_BIN"
}

# run_rounds: ROUNDS rounds of $COMPARE and oncekv, alternating which goes first; each
# system starts from empty data directories, is benchmarked (`bench SYSTEM ROUND`) and
# stopped.
run_rounds() {
    local round order system dir
    for round in $(seq "$ROUNDS"); do
        if ((round % 2 == 1)); then order="$COMPARE oncekv"; else order="oncekv $COMPARE"; fi
        for system in $order; do
            dir="$WORK/r$round-$system"
            log "round $round: starting $system"
            "start_$system" "$dir"
            log "round $round: $system is ready at $ENDPOINTS"
            bench "$system" "$round"
            stop_servers
            rm -rf "$dir/data" "$dir"/e[123]
        done
    done
}
