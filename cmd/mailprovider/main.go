// Command mailprovider is a fake transactional-mail API that stands in for
// the real provider in tests and demos. It has the provider's idempotency
// semantics (an Idempotency-Key header is required; a replay with the same
// key and body returns the first response without sending again; the same
// key with another body is refused), keeps its key table in an fsynced
// append-only file so that keys survive a crash, and can inject faults
// (errors before or after a send, delays) on request.
//
// Usage:
//
//	mailprovider [-addr 127.0.0.1:8025] [-data ./mailprovider-data] [-fail-rate 0] [-seed 0]
//
// On start it prints one line to standard output,
// "mailprovider listening on http://HOST:PORT", with the real port when the
// address asks for port 0; everything else goes to standard error.
package main

import (
	"flag"
	"fmt"
	"os"
)

func main() {
	var cfg config
	flag.StringVar(&cfg.addr, "addr", envOr("MAILPROVIDER_ADDR", "127.0.0.1:8025"),
		"listen address (env MAILPROVIDER_ADDR); port 0 picks a free port")
	flag.StringVar(&cfg.dataDir, "data", envOr("MAILPROVIDER_DATA", "./mailprovider-data"),
		"directory of the persistent key table (env MAILPROVIDER_DATA)")
	flag.Float64Var(&cfg.failRate, "fail-rate", 0,
		"probability (0..1) that a message request fails with 503 before sending")
	flag.Uint64Var(&cfg.seed, "seed", 0,
		"seed of the random faults of -fail-rate; 0 picks one (it is printed at start)")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "mailprovider: unexpected arguments: %v\n", flag.Args())
		os.Exit(2)
	}
	if err := run(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "mailprovider:", err)
		os.Exit(1)
	}
}

// envOr returns the environment variable name, or def when it is unset or empty.
func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
