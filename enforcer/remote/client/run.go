package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"github.com/gpuwarden/gpuwarden/enforcer/remote/link"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/session"
)

// Serve accepts the local program's connections (one per process that
// uses the driver) and relays each over a session of its own until lis is
// closed. Events (sessions begun, refused, ended) go to report.
func Serve(lis net.Listener, d *Dialer, req session.Request, report func(format string, args ...any)) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := lis.Accept()
		if err != nil {
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close() // on a refusal, the client library fails its calls
			link.Buffered(c)
			a, err := d.Attach(context.Background(), c.(*net.UnixConn), req)
			if err != nil {
				report("%v", err)
				return
			}
			w := a.Welcome
			report("session %s on %s (%s), %d MiB, weight %d, priority %s, %s", w.Session, w.GPU, w.Name,
				w.MemoryBytes>>20, w.Weight, w.Priority, a.Path())
			if err := a.Wait(); err != nil {
				report("session %s ended: %v", w.Session, err)
			}
		}()
	}
}

// Program is a command run against a remote GPU.
type Program struct {
	Args []string
	// LibDir holds the remote client library as libcuda.so.1 and
	// libnvidia-ml.so.1; it goes first on LD_LIBRARY_PATH.
	LibDir         string
	Env            []string // the program's environment, before the remote's variables
	Stdin          io.Reader
	Stdout, Stderr io.Writer
}

// Run runs p with its driver calls relayed to d's server (GPUWARDEN_REMOTE
// names a private unix socket) and returns its exit status (128+signal if
// a signal ended it). SIGINT and SIGTERM are passed on to it.
func Run(p Program, d *Dialer, req session.Request, report func(format string, args ...any)) (int, error) {
	if len(p.Args) == 0 {
		return 0, errors.New("no command to run")
	}
	dir, err := newSockDir()
	if err != nil {
		return 0, err
	}
	defer dir.close()
	sock := filepath.Join(dir.path, "driver.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		return 0, fmt.Errorf("listen on %s: %w", sock, err)
	}
	served := make(chan struct{})
	go func() { Serve(lis, d, req, report); close(served) }()
	defer func() { lis.Close(); <-served }()

	cmd := exec.Command(p.Args[0], p.Args[1:]...)
	cmd.Env = ProgramEnv(p.Env, p.LibDir, sock)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = p.Stdin, p.Stdout, p.Stderr
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("start %s: %w", p.Args[0], err)
	}
	go func() {
		for s := range sigs {
			_ = cmd.Process.Signal(s)
		}
	}()
	err = cmd.Wait()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, nil
	case errors.As(err, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal()), nil
		}
		return ee.ExitCode(), nil
	}
	return 0, err
}

// ProgramEnv is the program's environment: GPUWARDEN_REMOTE set to the
// socket, the client library's directory first on LD_LIBRARY_PATH.
func ProgramEnv(env []string, libDir, sock string) []string {
	out := make([]string, 0, len(env)+2)
	ldPath := libDir
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "GPUWARDEN_REMOTE":
			continue
		case "LD_LIBRARY_PATH":
			if v != "" {
				ldPath += ":" + v
			}
			continue
		}
		out = append(out, kv)
	}
	return append(out, "GPUWARDEN_REMOTE=unix:"+sock, "LD_LIBRARY_PATH="+ldPath)
}
