// Package hostcgroup reads which cgroup a process is in, from
// /proc/<pid>/cgroup, with one rule on every host layout: the path is the
// cgroup v2 one (the "0::" line), on a pure cgroup v2 host and on a hybrid
// one (v1 controllers beside v2 at /sys/fs/cgroup/unified) alike. eBPF
// names a container by its v2 cgroup id (bpf_get_current_cgroup_id), so a
// v1 path would place a process in a container nobody else sees; a file
// with no v2 line (a cgroup v1-only host) is an error, never a v1 path.
//
// The interposer reads its own /proc/self/cgroup by the same rule
// (enforcer/interposer/src/cgroup.c; a test runs both on the same inputs).
//
// The package also says where that hierarchy is mounted (Mount, from
// mountinfo) and how a path read in a cgroup namespace maps into the
// host's tree (HostPath, Within), so every part and test finds the same
// cgroup2 tree the same way.
package hostcgroup

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
)

const (
	// MaxFile is the most of a cgroup file read: the kernel writes one line
	// per hierarchy, each path at most PathMax bytes.
	MaxFile = 256 << 10
	// PathMax is the longest cgroup path the kernel shows (PATH_MAX less
	// its NUL; a longer one fails the read).
	PathMax = 4095
)

// ErrNoV2 is the error of a file without a cgroup v2 line: the host mounts
// no cgroup2 hierarchy (cgroup v1 only).
var ErrNoV2 = errors.New("no cgroup v2 (0::) line")

// Of returns the cgroup v2 path of process pid ("/kubepods/...", relative
// to the reader's cgroup namespace root), read from <procRoot>/<pid>/cgroup.
// procRoot is normally "/proc".
func Of(procRoot string, pid int) (string, error) {
	return File(filepath.Join(procRoot, strconv.Itoa(pid), "cgroup"))
}

// HostPath turns a process's cgroup path, as /proc/<pid>/cgroup shows it to
// a reader in its own cgroup namespace (relative to that namespace's root,
// "/../x" for what lies outside it), into the path in the host's tree, given
// the host path of the reader's namespace root ("/" outside any namespace).
func HostPath(nsRoot, p string) string {
	return path.Join("/", nsRoot, p)
}

// Within says whether cgroup p is root or lies under it.
func Within(p, root string) bool {
	p, root = path.Clean("/"+p), path.Clean("/"+root)
	return root == "/" || p == root || strings.HasPrefix(p, root+"/")
}

// File returns the cgroup v2 path in a /proc/<pid>/cgroup file; an error
// names the file.
func File(name string) (string, error) {
	f, err := os.Open(name)
	if err != nil {
		return "", fmt.Errorf("read cgroup: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxFile+1))
	if err != nil {
		return "", fmt.Errorf("read cgroup %s: %w", name, err)
	}
	p, err := Parse(b)
	if err != nil {
		return "", fmt.Errorf("%s: %w", name, err)
	}
	return p, nil
}

// Parse returns the cgroup v2 path in the text of a /proc/<pid>/cgroup
// file. Every line must be "<hierarchy id>:<controllers>:<path>" and the
// file must hold exactly one v2 line, "0::<path>", whose path is absolute
// and clean: no empty, "." or "/"-trailing component, ".." only leading
// (the kernel's way of naming a cgroup outside the reader's namespace
// root). Anything else is refused: the kernel never writes it, and on an
// older kernel a cgroup name holding a newline could forge a line.
func Parse(b []byte) (string, error) {
	if len(b) > MaxFile {
		return "", fmt.Errorf("longer than %d bytes", MaxFile)
	}
	text := string(b)
	if strings.IndexByte(text, 0) >= 0 {
		return "", errors.New("holds a NUL byte")
	}
	text = strings.TrimSuffix(text, "\n")
	if text == "" {
		return "", errors.New("empty")
	}
	v2, found, v1 := "", false, 0
	for i, line := range strings.Split(text, "\n") {
		id, rest, ok1 := strings.Cut(line, ":")
		ctrl, p, ok2 := strings.Cut(rest, ":")
		switch {
		case !ok1 || !ok2 || !decimal(id):
			return "", fmt.Errorf("line %d is not <hierarchy id>:<controllers>:<path>", i+1)
		case ctrl == "" && id != "0", ctrl != "" && id == "0":
			return "", fmt.Errorf("line %d: hierarchy %s with controllers %.32q", i+1, id, ctrl)
		case ctrl != "":
			v1++
		case found:
			return "", fmt.Errorf("line %d is a second cgroup v2 (0::) line", i+1)
		default:
			if err := checkPath(p); err != nil {
				return "", fmt.Errorf("line %d: cgroup v2 path: %w", i+1, err)
			}
			v2, found = p, true
		}
	}
	if !found {
		return "", fmt.Errorf("%w: the host mounts only cgroup v1 (%d v1 hierarchies); gpuwarden needs the cgroup v2 hierarchy (a cgroup v2 or hybrid host)", ErrNoV2, v1)
	}
	return v2, nil
}

func decimal(s string) bool {
	if s == "" || len(s) > 10 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// checkPath accepts the paths the kernel writes: "/", or "/"-separated
// names, any leading ones "..".
func checkPath(p string) error {
	switch {
	case !strings.HasPrefix(p, "/"):
		return fmt.Errorf("%.64q is not absolute", p)
	case len(p) > PathMax:
		return fmt.Errorf("longer than %d bytes", PathMax)
	case p == "/":
		return nil
	}
	named := false
	for _, c := range strings.Split(p[1:], "/") {
		switch {
		case c == "" || c == ".":
			return fmt.Errorf("%.64q has an empty or \".\" component", p)
		case c == "..":
			if named {
				return fmt.Errorf("%.64q has \"..\" after a name", p)
			}
		default:
			named = true
		}
	}
	return nil
}
