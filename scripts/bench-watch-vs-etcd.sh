#!/usr/bin/env bash
# Watch fan-out of oncekv next to etcd's: same machine, same run, same load generator
# (`oncekv bench watch`, which speaks the etcd v3 wire protocol to both).
#
#   scripts/bench-watch-vs-etcd.sh [extra `oncekv bench watch` flags...]
#
# Builds oncekv (release). Then, ROUNDS times, a 3-member etcd 3.4 and a 3-member
# `oncekv dev` (fsync on in both), alternating which goes first, each from empty data
# directories (start/stop as in scripts/bench-vs-etcd.sh: scripts/lib/bench-cluster.sh).
# Against each: WATCHERS watchers of one key on STREAMS streams over one connection per
# member (so followers serve watches too), one writer putting the key TOTAL times at RATE
# puts/s (0: as fast as one put at a time goes) to the first member. Prints each run
# (events delivered per second over all watchers, delivery latency from the put's send to
# the event's arrival, gaps/duplicates/missing, CPU used by the servers and by the load
# generator, load average), the totals and the ratios oncekv/etcd. A run in which any
# watcher missed, repeated or reordered an event fails the script.
#
# Environment (defaults in brackets):
#   WATCHERS [1000]  STREAMS [10]  TOTAL [2000] puts per run  RATE [0]  VALUE_SIZE [16]
#   ROUNDS [2]  COMPARE [etcd]  KEEP  ONCEKV_BIN  ONCEKV_DEV_ARGS (see the library).
set -euo pipefail

# shellcheck source=lib/bench-cluster.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/bench-cluster.sh"
WATCHERS=${WATCHERS:-1000}
STREAMS=${STREAMS:-10}
TOTAL=${TOTAL:-2000}
RATE=${RATE:-0}
VALUE_SIZE=${VALUE_SIZE:-16}
EXTRA=("$@")

# bench SYSTEM ROUND: the fan-out benchmark; $WORK/rROUND-SYSTEM.* hold the results.
bench() {
    local name=$1 round=$2
    local flags=(--endpoints "$ENDPOINTS" --watchers "$WATCHERS" --streams "$STREAMS"
        --total "$TOTAL" --rate "$RATE" --value-size "$VALUE_SIZE" --label "$name" -w json)
    log "$name: oncekv bench watch ${flags[*]} ${EXTRA[*]}"
    run_timed "$WORK/r$round-$name" "$BIN" bench watch "${flags[@]}" "${EXTRA[@]}"
}

# line OUT: one table row for a run.
line() {
    local out=$1 f=$1.json
    awk -v name="$(sed -n 's/.*"label":"\([^"]*\)".*/\1/p' "$f")" \
        -v round="$(basename "$out" | cut -d- -f1)" \
        -v puts="$(json_field "$f" puts)" -v put_rate="$(json_field "$f" put_rate)" \
        -v events="$(json_field "$f" events)" -v secs="$(json_field "$f" seconds)" \
        -v rate="$(json_field "$f" rate)" -v p50="$(json_field "$f" p50)" \
        -v p99="$(json_field "$f" p99)" -v max="$(json_field "$f" max)" \
        -v bad="$(($(json_field "$f" gaps) + $(json_field "$f" duplicates) + $(json_field "$f" missing)))" \
        -v server="$(cat "$out.server-cpu")" -v client="$(cat "$out.client-cpu-total")" \
        -v load="$(cat "$out.load")" 'BEGIN {
        printf "  %-3s %-8s %6d %7.0f | %9d %6.2f %9.0f | %7.2f %7.2f %8.2f | %4d | %7.2f %7.2f | %5.2f\n",
            round, name, puts, put_rate, events, secs, rate, p50, p99, max, bad, server, client, load
    }'
}

setup_bench_cluster bench-watch-vs-etcd
log "$WATCHERS watchers on $STREAMS streams, $TOTAL puts per run at ${RATE} puts/s (0: as fast as it can)"
run_rounds

echo
echo "watch fan-out: $WATCHERS watchers of one key on $STREAMS streams (one connection per member)," \
    "1 writer, $TOTAL puts of ${VALUE_SIZE}-byte values per run at rate $RATE, 3 members each, fsync on, $(nproc) CPUs"
echo "                          | events delivered           | delivery ms                | bad  | cpu seconds     |"
echo "  rnd system     puts  puts/s |    events   secs  events/s |     p50     p99      max | gdm  | servers  client | load"
for round in $(seq "$ROUNDS"); do
    for system in $COMPARE oncekv; do
        line "$WORK/r$round-$system"
    done
done
echo
awk -v work="$WORK" -v rounds="$ROUNDS" -v other="$COMPARE" "$AWK_FIELD"'
    BEGIN {
        for (r = 1; r <= rounds; r++) {
            e = work "/r" r "-" other ".json"; o = work "/r" r "-oncekv.json"
            erate = field(e, "rate"); orate = field(o, "rate"); ep = field(e, "p99"); op = field(o, "p99")
            e_ev += field(e, "events"); e_s += field(e, "seconds")
            o_ev += field(o, "events"); o_s += field(o, "seconds")
            rates = rates sprintf(" %.2f", erate > 0 ? orate / erate : 0)
            p99s = p99s sprintf(" %.2f", ep > 0 ? op / ep : 0)
        }
        e_rate = e_s > 0 ? e_ev / e_s : 0; o_rate = o_s > 0 ? o_ev / o_s : 0
        printf "  events/s: %s %.0f, oncekv %.0f over all rounds; ratio oncekv/%s %.2f (per round:%s)\n",
            other, e_rate, o_rate, other, (e_rate > 0 ? o_rate / e_rate : 0), rates
        printf "  delivery p99: ratio oncekv/%s per round:%s (lower is better for oncekv)\n", other, p99s
    }'
