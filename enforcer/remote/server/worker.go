package server

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gpuwarden/gpuwarden/enforcer/controlblock"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/link"
	"github.com/gpuwarden/gpuwarden/enforcer/remote/session"
	"github.com/gpuwarden/gpuwarden/enforcer/vocab"
)

// Worker is how sessions' worker processes are started.
type Worker struct {
	Path       string // bin/gpuwarden-worker
	Interposer string // libgpuwarden.so, preloaded into the worker
	ControlDir string // GPUWARDEN_CONTROL_DIR, the agent's
	// CgroupFS is the cgroup v2 mount; sessions' cgroups are made in
	// CgroupFS/CgroupParent.
	CgroupFS     string
	CgroupParent string
	// Env is the environment every worker starts from (the driver's
	// search path, say); GPUWARDEN_* and LD_PRELOAD in it are dropped.
	Env []string
}

// stopGrace is how long a worker has to exit on its own once its socket
// is closed, before its cgroup is killed.
const stopGrace = 2 * time.Second

func (w Worker) check() error {
	for _, p := range []struct{ what, v string }{{"worker", w.Path}, {"interposer", w.Interposer}} {
		if !filepath.IsAbs(p.v) {
			return fmt.Errorf("remote %s path %q: want an absolute path", p.what, p.v)
		}
		if _, err := os.Stat(p.v); err != nil {
			return fmt.Errorf("remote %s: %w", p.what, err)
		}
	}
	if w.CgroupFS == "" {
		return errors.New("remote sessions need the cgroup v2 tree")
	}
	if p := path.Clean("/" + w.CgroupParent); p == "/" || strings.Contains(w.CgroupParent, "..") {
		return fmt.Errorf("remote cgroup parent %q: want a directory below the root", w.CgroupParent)
	}
	return nil
}

func (w Worker) parentDir() string { return filepath.Join(w.CgroupFS, path.Clean("/"+w.CgroupParent)) }

// cgroupPath is a session's cgroup as the resolver names it.
func (w Worker) cgroupPath(name string) string {
	return path.Join(path.Clean("/"+w.CgroupParent), name)
}

// removeStale kills and removes the sessions' cgroups a previous server
// left (its workers exit when their sockets close, but a stuck one may
// remain).
func (w Worker) removeStale() error {
	if err := os.MkdirAll(w.parentDir(), 0o755); err != nil {
		return fmt.Errorf("make the sessions' cgroup: %w", err)
	}
	ents, err := os.ReadDir(w.parentDir())
	if err != nil {
		return fmt.Errorf("read the sessions' cgroup: %w", err)
	}
	for _, e := range ents {
		if e.IsDir() && strings.HasPrefix(e.Name(), "s-") {
			removeCgroup(filepath.Join(w.parentDir(), e.Name()))
		}
	}
	return nil
}

// env is the worker's environment: a local container's variables for the
// granted slice.
func (w Worker) env(g session.Welcome) ([]string, error) {
	set := map[string]string{
		"GPUWARDEN_MEMORY_LIMIT":   vocab.FormatSize(g.MemoryBytes),
		"GPUWARDEN_COMPUTE_WEIGHT": fmt.Sprint(g.Weight),
		"GPUWARDEN_PRIORITY":       g.Priority,
		"GPUWARDEN_CONTROL_DIR":    w.ControlDir,
		"CUDA_VISIBLE_DEVICES":     g.GPU,
		"LD_PRELOAD":               w.Interposer,
	}
	// The interposer reads the same variables: a value it would refuse is
	// refused here, before a worker starts.
	if _, err := controlblock.ParseEnv(func(k string) (string, bool) { v, ok := set[k]; return v, ok }); err != nil {
		return nil, err
	}
	var env []string
	for _, kv := range w.Env {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "GPUWARDEN_") || strings.HasPrefix(k, "ALIYUN_COM_GPU_") || k == "LD_PRELOAD" ||
			k == "CUDA_VISIBLE_DEVICES" || k == "NVIDIA_VISIBLE_DEVICES" {
			continue
		}
		env = append(env, kv)
	}
	for k, v := range set {
		env = append(env, k+"="+v)
	}
	return env, nil
}

// proc is one session's worker.
type proc struct {
	cmd    *exec.Cmd
	sock   net.Conn // the server's end of the worker's socket
	cgroup string   // directory
	done   chan struct{}
	killed atomic.Bool // by stop, after its grace
}

// start makes the session's cgroup and starts its worker in it, fd 3 one
// end of a socket pair whose other end the server relays.
func (w Worker) start(name string, g session.Welcome, log *slog.Logger) (*proc, error) {
	env, err := w.env(g)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(w.parentDir(), name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("make the session's cgroup: %w", err)
	}
	cgfd, err := syscall.Open(dir, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		removeCgroup(dir)
		return nil, fmt.Errorf("open the session's cgroup: %w", err)
	}
	defer syscall.Close(cgfd)
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		removeCgroup(dir)
		return nil, fmt.Errorf("socket pair: %w", err)
	}
	mine, theirs := os.NewFile(uintptr(fds[0]), "session"), os.NewFile(uintptr(fds[1]), "worker")
	defer theirs.Close()
	sock, err := net.FileConn(mine)
	mine.Close()
	if err == nil {
		link.Buffered(sock)
	}
	if err != nil {
		theirs.Close()
		removeCgroup(dir)
		return nil, fmt.Errorf("socket pair: %w", err)
	}
	cmd := exec.Command(w.Path, "--fd", "3")
	cmd.Env = env
	cmd.ExtraFiles = []*os.File{theirs}
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: cgfd}
	stderr, err := cmd.StderrPipe()
	if err == nil {
		err = cmd.Start()
	}
	if err != nil {
		sock.Close()
		removeCgroup(dir)
		return nil, fmt.Errorf("start %s: %w", w.Path, err)
	}
	p := &proc{cmd: cmd, sock: sock, cgroup: dir, done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			log.Info("remote: worker", "pid", cmd.Process.Pid, "stderr", sc.Text())
		}
		err := cmd.Wait()
		if err != nil && !p.killed.Load() { // a crash, or a kill from outside: the client sees its link close
			log.Warn("remote: worker ended abnormally", "pid", cmd.Process.Pid, "status", err.Error())
		} else {
			log.Debug("remote: worker exited", "pid", cmd.Process.Pid, "status", fmt.Sprint(err))
		}
		close(p.done)
	}()
	return p, nil
}

// stop closes the worker's socket (it exits on its own), kills what is
// left in its cgroup after a grace period, reaps it and removes the cgroup.
func (p *proc) stop(log *slog.Logger) {
	p.sock.Close()
	select {
	case <-p.done:
	case <-time.After(stopGrace):
		log.Warn("remote: worker still running after its session ended; killing its cgroup", "pid", p.cmd.Process.Pid)
		p.killed.Store(true)
		_ = p.cmd.Process.Kill()
	}
	removeCgroup(p.cgroup)
	<-p.done
}

// removeCgroup kills every process in a session's cgroup and removes it.
func removeCgroup(dir string) {
	_ = os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0)
	for i := 0; i < 100; i++ {
		if err := os.Remove(dir); err == nil || os.IsNotExist(err) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}
