package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"

	"github.com/gpuwarden/gpuwarden/cmd/gpuwarden/internal/agent"
	"github.com/gpuwarden/gpuwarden/cmd/gpuwarden/internal/config"
)

// runAgent is `gpuwarden agent`: the node daemon, until SIGTERM or SIGINT.
func runAgent(args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("agent", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	config.Flags(fs)
	check := fs.Bool("check-config", false, "validate the configuration and exit")
	reference := fs.Bool("print-config-reference", false, "print the configuration reference table (Markdown) and exit")
	readyFD := fs.Int("ready-fd", 0, "once the agent is ready (/healthz answers), write its HTTP address and a newline on this file descriptor and close it")
	if err := fs.Parse(args); err != nil {
		if err != pflag.ErrHelp {
			fmt.Fprintf(stderr, "gpuwarden agent: %v\n", err)
		}
		return 2
	}
	if *reference {
		fmt.Fprint(stdout, config.Reference())
		return 0
	}
	cfg, err := config.Load(fs, os.Environ())
	if err != nil {
		fmt.Fprintf(stderr, "gpuwarden agent: %v\n", err)
		return 2
	}
	if *check {
		fmt.Fprintln(stdout, "configuration is valid")
		return 0
	}
	log := newLogger(cfg, stderr)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	a, err := agent.Start(ctx, cfg, version, log)
	if err != nil {
		log.Error("agent failed to start", "err", err)
		return 1
	}
	if *readyFD > 0 {
		if err := signalReady(*readyFD, a.Addr()); err != nil {
			log.Error("agent failed to start", "err", err)
			_ = a.Close()
			return 1
		}
	}
	<-ctx.Done()
	log.Info("shutting down")
	if err := a.Close(); err != nil {
		log.Error("shutdown", "err", err)
		return 1
	}
	return 0
}

// signalReady tells the process that started the agent that it is ready
// (agentapi.AwaitReady reads it).
func signalReady(fd int, addr string) error {
	f := os.NewFile(uintptr(fd), "ready-fd")
	_, err := fmt.Fprintln(f, addr)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("--ready-fd=%d: %w", fd, err)
	}
	return nil
}

func newLogger(cfg config.Config, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.Log.Level))
	opts := &slog.HandlerOptions{Level: level}
	if cfg.Log.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
