// Command oncekv-writer does N puts to each of K keys, the way a careful etcd user would:
// every failed put is tried again, up to 20 times. With --mode plain it uses etcd's client
// as it is, so a put whose reply was lost and that is resent is applied twice (a key's
// version ends above N). With --mode tracked the puts go through the oncekv interceptor:
// it retries inside, under the same sequence number, and a put whose outcome it could not
// learn comes back as outcome unknown, which this program counts and never resends.
// Both modes get the same patience per put: plain makes up to 20 tries of --timeout
// each; tracked gives the interceptor one deadline of 20 times --timeout, with --timeout
// as its per-attempt limit.
//
//	oncekv-writer --endpoints 127.0.0.1:2379 --prefix k --keys 4 --puts 100 --mode tracked
//
// It prints one JSON line: {"acked":..,"failed":..,"unknown":..,"puts_attempted":..}.
// "acked" puts succeeded; "failed" ones got 20 errors; "unknown" ones (tracked only) may
// or may not have been applied; "puts_attempted" is K*N. A key's version may then end
// anywhere in [acked, acked + unknown] in tracked mode; in plain mode it may pass N.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/clientv3"
	"go.uber.org/zap"

	"oncekv/clients/go/oncekv"
)

const maxTries = 20

var verbose bool

type result struct {
	Acked         int64 `json:"acked"`
	Failed        int64 `json:"failed"`
	Unknown       int64 `json:"unknown"`
	PutsAttempted int64 `json:"puts_attempted"`
}

func main() {
	endpoints := flag.String("endpoints", "127.0.0.1:2379", "comma-separated client URLs")
	prefix := flag.String("prefix", "writer-", "key prefix: keys are PREFIX0 .. PREFIX{K-1}")
	keys := flag.Int("keys", 1, "number of keys, written concurrently")
	puts := flag.Int("puts", 10, "puts per key, one after another")
	mode := flag.String("mode", "tracked", "tracked (through oncekv sessions) or plain (etcd's client alone)")
	timeout := flag.Duration("timeout", 2*time.Second, "deadline of each try of a put (tracked: of each attempt the interceptor makes)")
	flag.BoolVar(&verbose, "v", false, "print the error of each put counted unknown or failed to stderr")
	flag.Parse()
	if *mode != "tracked" && *mode != "plain" {
		fmt.Fprintln(os.Stderr, "oncekv-writer: --mode is tracked or plain")
		os.Exit(2)
	}
	if *keys < 1 || *puts < 0 {
		fmt.Fprintln(os.Stderr, "oncekv-writer: --keys must be at least 1 and --puts not negative")
		os.Exit(2)
	}

	// clientv3 logs each failed attempt; the faults this program is run under are many.
	logCfg := zap.NewProductionConfig()
	logCfg.Level = zap.NewAtomicLevelAt(zap.ErrorLevel)
	cfg := clientv3.Config{
		Endpoints:   strings.Split(*endpoints, ","),
		DialTimeout: 10 * time.Second,
		LogConfig:   &logCfg,
	}
	var cli *clientv3.Client
	var sess *oncekv.Session
	var err error
	patience := *timeout
	if *mode == "tracked" {
		patience = maxTries * *timeout
		cli, sess, err = oncekv.New(cfg, oncekv.Options{AttemptTimeout: *timeout, MaxRetryTime: patience})
	} else {
		cli, err = clientv3.New(cfg)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "oncekv-writer: connecting: %v\n", err)
		os.Exit(1)
	}

	var res result
	var wg sync.WaitGroup
	for k := 0; k < *keys; k++ {
		wg.Add(1)
		go func(key string) {
			defer wg.Done()
			for i := 0; i < *puts; i++ {
				atomic.AddInt64(&res.PutsAttempted, 1)
				switch put(cli, key, fmt.Sprint(i), patience) {
				case acked:
					atomic.AddInt64(&res.Acked, 1)
				case unknown:
					atomic.AddInt64(&res.Unknown, 1)
				default:
					atomic.AddInt64(&res.Failed, 1)
				}
			}
		}(fmt.Sprintf("%s%d", *prefix, k))
	}
	wg.Wait()

	if sess != nil {
		if err := sess.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "oncekv-writer: closing the session: %v\n", err)
		}
	}
	_ = cli.Close()
	line, _ := json.Marshal(res)
	fmt.Println(string(line))
}

type outcome int

const (
	acked outcome = iota
	failed
	unknown
)

// put tries one put up to maxTries times. An outcome-unknown error ends it: the put may
// have been applied, and resending it could apply it twice, which is the very thing the
// tracked mode is there to prevent. Any other error is resent, as etcd users do; in
// tracked mode those are errors of puts that never reached the cluster.
func put(cli *clientv3.Client, key, value string, timeout time.Duration) outcome {
	for try := 0; try < maxTries; try++ {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		_, err := cli.Put(ctx, key, value)
		cancel()
		if err == nil {
			return acked
		}
		if oncekv.IsOutcomeUnknown(err) {
			if verbose {
				fmt.Fprintf(os.Stderr, "unknown: %s: %v\n", key, err)
			}
			return unknown
		}
		if verbose && try == maxTries-1 {
			fmt.Fprintf(os.Stderr, "failed: %s: %v\n", key, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return failed
}
