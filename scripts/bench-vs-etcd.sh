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
#   WORKLOAD [put]: "put", or "range" (linearizable gets of the key space; CONSISTENCY=s
#     for serializable ones)
#   CLIENTS [64]  TOTAL [50000] puts per run  VALUE_SIZE [256]  KEY_SIZE [8]
#   KEY_SPACE [100000]  CONNECTIONS [one per endpoint]  ROUNDS [2]
#   MODES ["all"]: "all" sends to every member (followers forward to the leader, in
#     etcd as in oncekv); "leader" sends only to the leader; "all leader" runs both.
#   KEEP=1 keeps the temporary directory (logs, per-run JSON) for inspection.
#   ONCEKV_BIN=path: use this oncekv binary instead of building one.
#   ONCEKV_DEV_ARGS="...": extra flags for `oncekv dev` (e.g. --max-inflight-entries 1).
#   COMPARE=baseline BASELINE_BIN=path: compare with `oncekv dev` of another oncekv binary
#     (e.g. one built at an older commit) instead of etcd; the rows and the ratio then name
#     it "baseline". See scripts/lib/bench-cluster.sh.
#
# Throughput on a small shared machine depends on what else runs (fsync latency above
# all): compare the two systems within a round, and look at the load average column.
set -euo pipefail

# shellcheck source=lib/bench-cluster.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/bench-cluster.sh"
CLIENTS=${CLIENTS:-64}
TOTAL=${TOTAL:-50000}
VALUE_SIZE=${VALUE_SIZE:-256}
KEY_SIZE=${KEY_SIZE:-8}
KEY_SPACE=${KEY_SPACE:-100000}
CONNECTIONS=${CONNECTIONS:-}
MODES=${MODES:-all}
WORKLOAD=${WORKLOAD:-put}
CONSISTENCY=${CONSISTENCY:-l}
EXTRA=("$@")

# bench SYSTEM ROUND: the put benchmark in every mode; $WORK/rROUND-SYSTEM-MODE.* hold the
# results.
bench() {
    local name=$1 round=$2 mode
    for mode in $MODES; do
        local flags=(--endpoints "$ENDPOINTS" --clients "$CLIENTS" --total "$TOTAL"
            --key-size "$KEY_SIZE" --key-space "$KEY_SPACE" --label "$name" -w json)
        case $WORKLOAD in
            put) flags+=(--value-size "$VALUE_SIZE") ;;
            range) flags+=(--consistency "$CONSISTENCY") ;;
            *) echo "WORKLOAD must be put or range" >&2; exit 2 ;;
        esac
        if [[ -n $CONNECTIONS ]]; then flags+=(--connections "$CONNECTIONS"); fi
        if [[ $mode == leader ]]; then flags+=(--leader-only); fi
        log "$name ($mode): oncekv bench $WORKLOAD ${flags[*]} ${EXTRA[*]}"
        run_timed "$WORK/r$round-$name-$mode" "$BIN" bench "$WORKLOAD" "${flags[@]}" "${EXTRA[@]}"
    done
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
        -v client="$(cat "$out.client-cpu-total")" 'BEGIN {
        printf "  %-3s %-8s %-6s %7d %7.2f %8.0f | %6.2f %6.2f %6.2f %6.2f %7.2f | %7.2f %5.2f %7.2f | %5.2f\n",
            round, name, mode, ok, secs, rate, avg, p50, p90, p99, max, server, server / secs, client, load
    }'
}

setup_bench_cluster bench-vs-etcd
log "$WORKLOAD: $CLIENTS clients, $TOTAL requests per run, modes: $MODES"
run_rounds

echo
echo "$WORKLOAD: $CLIENTS clients, $TOTAL requests per run, ${KEY_SIZE}-byte keys over $KEY_SPACE keys," \
    "${VALUE_SIZE}-byte values, 3 members each, fsync on, $(nproc) CPUs"
echo "                                           | latency ms                           | cpu seconds          |"
echo "  rnd system   mode        ok    secs   ops/s |    avg    p50    p90    p99     max | servers cores  client | load"
for round in $(seq "$ROUNDS"); do
    for mode in $MODES; do
        for system in $COMPARE oncekv; do
            line "$WORK/r$round-$system-$mode"
        done
    done
done
echo
for mode in $MODES; do
    awk -v mode="$mode" -v work="$WORK" -v rounds="$ROUNDS" -v other="$COMPARE" "$AWK_FIELD"'
        BEGIN {
            for (r = 1; r <= rounds; r++) {
                eo = field(work "/r" r "-" other "-" mode ".json", "ok"); es = field(work "/r" r "-" other "-" mode ".json", "seconds")
                oo = field(work "/r" r "-oncekv-" mode ".json", "ok"); os = field(work "/r" r "-oncekv-" mode ".json", "seconds")
                e_ok += eo; e_s += es; o_ok += oo; o_s += os
                ratios = ratios sprintf(" %.2f", (es > 0 && oo > 0) ? (oo / os) / (eo / es) : 0)
            }
            e_rate = e_s > 0 ? e_ok / e_s : 0; o_rate = o_s > 0 ? o_ok / o_s : 0
            printf "  %s: %s %.0f ops/s, oncekv %.0f ops/s over all rounds; ratio oncekv/%s %.2f (per round:%s)\n",
                mode, other, e_rate, o_rate, other, (e_rate > 0 ? o_rate / e_rate : 0), ratios
        }'
done
