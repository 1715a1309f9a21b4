# shellcheck shell=bash
# VIA=proxy for the client-suite-* scripts: the suite dials a grpc-proxy in front of the
# cluster instead of a member, so the proxy's promise ("etcd clients pass through it as
# they pass directly") is checked by the clients' own tests. Sourced, never run.
#
#   start_proxy ENDPOINTS LISTEN_ADDR [FLAGS...]: starts `oncekv grpc-proxy start` (or
#     `etcd grpc-proxy start` with TARGET=etcd, the reference) for the comma-separated
#     client URLs ENDPOINTS on LISTEN_ADDR (host:port), with FLAGS (TLS) added; its pid
#     goes in $proxy_pid. Its log goes to $PROXY_LOG (default: $data/proxy.log, removed
#     with $data); ONCEKV_LOG=info,oncekv_proxy=debug makes oncekv's proxy say more.

proxy_pid=""

start_proxy() {
    local endpoints=$1 listen=$2
    shift 2
    local log=${PROXY_LOG:-$data/proxy.log}
    echo "== grpc-proxy ($TARGET) on $listen for $endpoints (log: $log)"
    if [ "$TARGET" = etcd ]; then
        etcd grpc-proxy start --endpoints "$endpoints" --listen-addr "$listen" "$@" \
            > "$log" 2>&1 &
    else
        target/debug/oncekv grpc-proxy start --endpoints "$endpoints" --listen-addr "$listen" \
            "$@" > "$log" 2>&1 &
    fi
    proxy_pid=$!
}
