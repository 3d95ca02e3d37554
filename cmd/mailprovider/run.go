package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// config is what the command line (and its environment fallbacks) sets.
type config struct {
	addr     string
	dataDir  string
	failRate float64
	seed     uint64
}

// shutdownGrace bounds how long in-flight requests may take after SIGTERM.
const shutdownGrace = 10 * time.Second

// run opens the store, listens, announces the address on stdout and serves
// until SIGINT or SIGTERM, then shuts down gracefully.
func run(cfg config) error {
	if cfg.failRate < 0 || cfg.failRate > 1 {
		return fmt.Errorf("-fail-rate %g is outside 0..1", cfg.failRate)
	}
	seed := cfg.seed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	srv, err := NewServer(cfg.dataDir, Options{FailRate: cfg.failRate, Seed: seed, Logger: logger})
	if err != nil {
		return err
	}
	defer srv.Close()

	ln, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.addr, err)
	}
	fmt.Fprintf(os.Stderr, "mailprovider: data=%s fail-rate=%g seed=%d keys=%d\n",
		cfg.dataDir, cfg.failRate, seed, srv.store.count())
	// The one line on stdout: a parent process reads it to learn the address.
	fmt.Fprintf(os.Stdout, "mailprovider listening on http://%s\n", ln.Addr())

	hs := &http.Server{
		Handler:           srv,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()

	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	stop() // a second signal kills the process the default way
	logger.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	return srv.Close()
}
