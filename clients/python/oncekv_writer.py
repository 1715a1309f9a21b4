"""oncekv-writer: many puts through python-etcd3, tracked (oncekv sessions) or plain.

For side-by-side proofs: run it against a cluster behind a fault proxy in both modes and
compare each key's final version with the puts that were acknowledged. Plain mode is what
a careful etcd user writes (retry on any error, up to 20 times), which can apply a put
twice when a reply is lost; tracked mode retries the same way, but an error it gets from
the interceptor means "not applied" (or a final answer), and an OutcomeUnknown is counted,
never resent.

    oncekv-writer --endpoint 127.0.0.1:2379 --prefix k --keys 4 --puts 100 --mode tracked

Prints one JSON line: {"acked", "failed", "unknown", "puts_attempted", ...}; puts_attempted
is keys * puts and equals acked + failed + unknown.
"""

import argparse
import json
import sys
import threading
import time

MAX_TRIES = 20


def _parse(argv):
    p = argparse.ArgumentParser(prog="oncekv-writer", description=__doc__.split("\n")[0])
    p.add_argument("--endpoint", required=True, help="host:port of one member (or a proxy)")
    p.add_argument("--prefix", required=True, help="keys are PREFIX0 .. PREFIX{K-1}")
    p.add_argument("--keys", type=int, required=True)
    p.add_argument("--puts", type=int, required=True, help="puts per key")
    p.add_argument("--mode", choices=("tracked", "plain"), required=True)
    p.add_argument("--timeout", type=float, default=2.0,
                   help="seconds one attempt waits (plain: the etcd3 call timeout; tracked: "
                        "the first attempt's timeout, later ones double it)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="print each error (retried, unknown, failed) to stderr")
    p.add_argument("--budget", type=float, default=30.0,
                   help="tracked mode: seconds the interceptor retries one put before it "
                        "reports its outcome unknown")
    return p.parse_args(argv)


def _client(args):
    host, _, port = args.endpoint.rpartition(":")
    if args.mode == "plain":
        import etcd3
        client = etcd3.client(host=host, port=int(port), timeout=args.timeout)
        # As oncekv.client does (see SessionChannel): keep grpcio's reconnects driven, or
        # after a member's restart this channel would fail every call for minutes, and the
        # two modes would not meet the same network.
        client.channel.subscribe(lambda _state: None, try_to_connect=True)
        return client
    import oncekv
    return oncekv.client(host=host, port=int(port), attempt_timeout=args.timeout,
                         max_attempt_timeout=max(args.timeout, 8.0), budget=args.budget)


def run(args):
    from oncekv import OutcomeUnknown

    client = _client(args)
    counts = {"acked": 0, "failed": 0, "unknown": 0, "retries": 0}
    lock = threading.Lock()

    def count(field, n=1):
        with lock:
            counts[field] += n

    def say(key, i, attempt, what, error):
        if args.verbose:
            detail = error
            if hasattr(error, "code") and callable(error.code):
                detail = "%s: %s" % (error.code(), error.details())
            print("%.3f %s put %d try %d: %s: %s: %s" % (time.time(), key, i, attempt + 1, what,
                                                        type(error).__name__, detail),
                  file=sys.stderr, flush=True)

    def writer(key):
        for i in range(args.puts):
            value = "%s-%d" % (key, i)
            for attempt in range(MAX_TRIES):
                if attempt:
                    count("retries")
                    time.sleep(0.1)
                try:
                    client.put(key, value)
                    count("acked")
                    break
                except OutcomeUnknown as e:
                    # The put may have run: resending it could make it run twice.
                    say(key, i, attempt, "unknown", e)
                    count("unknown")
                    break
                except Exception as e:  # noqa: BLE001 -- any etcd3 or grpc error: a naive user retries
                    say(key, i, attempt, "failed" if attempt == MAX_TRIES - 1 else "retry", e)
                    continue
            else:
                count("failed")

    threads = [threading.Thread(target=writer, args=("%s%d" % (args.prefix, k),))
               for k in range(args.keys)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if args.mode == "tracked":
        # The interceptor's own retries (same seq), which the loop above never sees.
        counts["interceptor"] = client.session.stats.snapshot()
    client.close()
    counts["puts_attempted"] = args.keys * args.puts
    counts["mode"] = args.mode
    return counts


def main(argv=None):
    args = _parse(argv if argv is not None else sys.argv[1:])
    print(json.dumps(run(args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
