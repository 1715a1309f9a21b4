#!/usr/bin/env bash
# Put throughput of oncekv next to etcd's: same machine, same run, same load generator
# (`oncekv bench put`, which speaks the etcd v3 wire protocol to both).
#
#   scripts/bench-vs-etcd.sh [extra `oncekv bench put` flags...]
#
# Builds oncekv (release). Then, ROUNDS times: starts a 3-member etcd on 127.0.0.1 (ports
# 14379/14380, 24379/24380, 34379/34380; fsync on, as etcd does by default), benchmarks it,
# stops it; starts `oncekv dev` (3 members in one process, fsync on), benchmarks it, stops
# it. Odd rounds run etcd first, even rounds oncekv first, and every round starts from
# empty data directories. Prints each run (throughput, latency, CPU used by the servers and
# by the load generator, load average of the machine), the totals and the ratio
# oncekv/etcd.
#
# Environment (defaults in brackets):
#   CLIENTS [64]  TOTAL [50000] puts per run  VALUE_SIZE [256]  KEY_SIZE [8]
#   KEY_SPACE [100000]  CONNECTIONS [one per endpoint]  ROUNDS [2]
#   MODES ["all"]: "all" sends to every member (followers forward to the leader, in
#     etcd as in oncekv); "leader" sends only to the leader; "all leader" runs both.
#   KEEP=1 keeps the temporary directory (logs, per-run JSON) for inspection.
#   ONCEKV_BIN=path: use this oncekv binary instead of building one.
#   ONCEKV_DEV_ARGS="...": extra flags for `oncekv dev` (e.g. --max-inflight-entries 1).
#
# Throughput on a small shared machine depends on what else runs (fsync latency above
# all): compare the two systems within a round, and look at the load average column.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/tmp/cargo-target}
CLIENTS=${CLIENTS:-64}
TOTAL=${TOTAL:-50000}
VALUE_SIZE=${VALUE_SIZE:-256}
KEY_SIZE=${KEY_SIZE:-8}
KEY_SPACE=${KEY_SPACE:-100000}
CONNECTIONS=${CONNECTIONS:-}
ROUNDS=${ROUNDS:-2}
MODES=${MODES:-all}
EXTRA=("$@")

for tool in etcd etcdctl; do
    if ! command -v "$tool" >/dev/null; then
        echo "bench-vs-etcd: $tool not found (.ci/install-deps installs it)" >&2
        exit 1
    fi
done

WORK=$(mktemp -d "${TMPDIR:-/tmp}/bench-vs-etcd.XXXXXX")
SERVER_PIDS=()
ENDPOINTS=""

log() { echo "bench-vs-etcd: $*" >&2; }

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
trap cleanup EXIT
trap 'exit 130' INT TERM

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

# json_field FILE KEY: a number from the (flat, one-line) JSON summary of `oncekv bench`.
json_field() {
    sed -n "s/.*\"$2\":\([0-9.]*\).*/\1/p" "$1" | head -n 1
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

start_oncekv() { # start_oncekv DIR
    local dir=$1 attempt
    mkdir -p "$dir"
    # shellcheck disable=SC2086 # ONCEKV_DEV_ARGS is a list of flags
    "$BIN" dev --data-dir "$dir/data" ${ONCEKV_DEV_ARGS:-} >"$dir/out" 2>"$dir/log" &
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

# bench NAME MODE OUT: runs the put benchmark against $ENDPOINTS; OUT.* hold the results.
bench() {
    local name=$1 mode=$2 out=$3 before after status=0
    local flags=(--endpoints "$ENDPOINTS" --clients "$CLIENTS" --total "$TOTAL"
        --value-size "$VALUE_SIZE" --key-size "$KEY_SIZE" --key-space "$KEY_SPACE"
        --label "$name" -w json)
    if [[ -n $CONNECTIONS ]]; then flags+=(--connections "$CONNECTIONS"); fi
    if [[ $mode == leader ]]; then flags+=(--leader-only); fi
    awk '{ print $1 }' /proc/loadavg >"$out.load"
    before=$(cpu_seconds "${SERVER_PIDS[@]}")
    log "$name ($mode): oncekv bench put ${flags[*]} ${EXTRA[*]}"
    /usr/bin/time -f "%U %S" -o "$out.client-cpu" \
        "$BIN" bench put "${flags[@]}" "${EXTRA[@]}" >"$out.json" 2>"$out.progress" || status=$?
    after=$(cpu_seconds "${SERVER_PIDS[@]}")
    awk -v a="$after" -v b="$before" 'BEGIN { printf "%.2f", a - b }' >"$out.server-cpu"
    sed 's/^/    /' "$out.progress" >&2
    if [[ $status -ne 0 ]]; then
        log "$name ($mode): the benchmark failed (exit $status)"
        cat "$out.json" >&2 || true
        exit "$status"
    fi
}

# line OUT: one table row for a run.
line() {
    local out=$1
    awk -v name="$(sed -n 's/.*"label":"\([^"]*\)".*/\1/p' "$out.json")" \
        -v mode="$(basename "$out" | cut -d- -f3)" -v round="$(basename "$out" | cut -d- -f1)" \
        -v secs="$(json_field "$out.json" seconds)" -v rate="$(json_field "$out.json" rate)" \
        -v ok="$(json_field "$out.json" ok)" -v avg="$(json_field "$out.json" avg)" \
        -v p50="$(json_field "$out.json" p50)" -v p90="$(json_field "$out.json" p90)" \
        -v p99="$(json_field "$out.json" p99)" -v max="$(json_field "$out.json" max)" \
        -v server="$(cat "$out.server-cpu")" -v load="$(cat "$out.load")" \
        -v client="$(awk '{ c = $1 + $2 } END { printf "%.2f", c }' "$out.client-cpu")" 'BEGIN {
        printf "  %-3s %-6s %-6s %7d %7.2f %8.0f | %6.2f %6.2f %6.2f %6.2f %7.2f | %7.2f %5.2f %7.2f | %5.2f\n",
            round, name, mode, ok, secs, rate, avg, p50, p90, p99, max, server, server / secs, client, load
    }'
}

if [[ -n ${ONCEKV_BIN:-} ]]; then
    BIN=$ONCEKV_BIN
else
    log "building oncekv (release)"
    cargo build --release --quiet -p oncekv --manifest-path "$ROOT/Cargo.toml"
    BIN=$CARGO_TARGET_DIR/release/oncekv
fi
log "etcd $(etcd --version | head -n 1 | awk '{ print $3 }'), $(nproc) CPUs, $CLIENTS clients, $TOTAL puts per run, $ROUNDS rounds, modes: $MODES"

for round in $(seq "$ROUNDS"); do
    if ((round % 2 == 1)); then order="etcd oncekv"; else order="oncekv etcd"; fi
    for system in $order; do
        dir="$WORK/r$round-$system"
        log "round $round: starting $system"
        "start_$system" "$dir"
        log "round $round: $system is ready at $ENDPOINTS"
        for mode in $MODES; do
            bench "$system" "$mode" "$WORK/r$round-$system-$mode"
        done
        stop_servers
        rm -rf "$dir/data" "$dir"/e[123]
    done
done

echo
echo "put: $CLIENTS clients, $TOTAL puts per run, ${KEY_SIZE}-byte keys over $KEY_SPACE keys," \
    "${VALUE_SIZE}-byte values, 3 members each, fsync on, $(nproc) CPUs"
echo "                                         | latency ms                           | cpu seconds          |"
echo "  rnd system mode        ok    secs  puts/s |    avg    p50    p90    p99     max | servers cores  client | load"
for round in $(seq "$ROUNDS"); do
    for mode in $MODES; do
        for system in etcd oncekv; do
            line "$WORK/r$round-$system-$mode"
        done
    done
done
echo
for mode in $MODES; do
    awk -v mode="$mode" -v work="$WORK" -v rounds="$ROUNDS" 'function field(file, key,   line, re) {
            getline line < file; close(file)
            re = "\"" key "\":[0-9.]+"
            if (match(line, re)) return substr(line, RSTART + length(key) + 3, RLENGTH - length(key) - 3) + 0
            return 0
        }
        BEGIN {
            for (r = 1; r <= rounds; r++) {
                eo = field(work "/r" r "-etcd-" mode ".json", "ok"); es = field(work "/r" r "-etcd-" mode ".json", "seconds")
                oo = field(work "/r" r "-oncekv-" mode ".json", "ok"); os = field(work "/r" r "-oncekv-" mode ".json", "seconds")
                e_ok += eo; e_s += es; o_ok += oo; o_s += os
                ratios = ratios sprintf(" %.2f", (es > 0 && oo > 0) ? (oo / os) / (eo / es) : 0)
            }
            e_rate = e_s > 0 ? e_ok / e_s : 0; o_rate = o_s > 0 ? o_ok / o_s : 0
            printf "  %s: etcd %.0f puts/s, oncekv %.0f puts/s over all rounds; ratio oncekv/etcd %.2f (per round:%s)\n",
                mode, e_rate, o_rate, (e_rate > 0 ? o_rate / e_rate : 0), ratios
        }'
done
