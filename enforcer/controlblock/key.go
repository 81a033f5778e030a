package controlblock

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
)

// ContainerKey escapes a cgroup v2 path into the one directory name under the
// control directory that holds the container's control block. It computes
// what the interposer's gw_container_key computes (a test runs both):
//   - the leading '/'s are dropped; "/" (or "") is "root";
//   - '/' becomes '+'; bytes in [A-Za-z0-9_-] stay, and so does '.' except
//     as the first byte; every other byte is %XX (upper-case hex);
//   - an escaped key over 200 bytes keeps its first 183 bytes and gets '~'
//     and the 16 hex digits of the FNV-1a 64 hash of the path (without its
//     leading '/'s).
func ContainerKey(cgroupPath string) string {
	const hex = "0123456789ABCDEF"
	p := strings.TrimLeft(cgroupPath, "/")
	if p == "" {
		return "root"
	}
	var b strings.Builder
	truncated := false
	for i := 0; i < len(p); i++ {
		c := p[i]
		var piece string
		switch {
		case c == '/':
			piece = "+"
		case c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '_', c == '-',
			c == '.' && b.Len() > 0:
			piece = string(c)
		default:
			piece = string([]byte{'%', hex[c>>4], hex[c&15]})
		}
		if b.Len()+len(piece) > 200 {
			truncated = true
		}
		if !truncated {
			b.WriteString(piece)
		}
	}
	if !truncated {
		return b.String()
	}
	h := uint64(0xcbf29ce484222325)
	for i := 0; i < len(p); i++ {
		h ^= uint64(p[i])
		h *= 0x100000001b3
	}
	k := b.String()
	if len(k) > 183 {
		k = k[:183]
	}
	return fmt.Sprintf("%s~%016X", k, h)
}

// KeyPath is the cgroup path a control directory's name was escaped from,
// where ContainerKey's escaping can be undone (not a truncated key); ok is
// false for a name that ContainerKey never makes.
func KeyPath(key string) (path string, ok bool) {
	if key == "root" {
		return "/", true
	}
	var b strings.Builder
	b.WriteByte('/')
	for i := 0; i < len(key); i++ {
		switch c := key[i]; c {
		case '+':
			b.WriteByte('/')
		case '%':
			if i+2 >= len(key) {
				return "", false
			}
			v, err := strconv.ParseUint(key[i+1:i+3], 16, 8)
			if err != nil {
				return "", false
			}
			b.WriteByte(byte(v))
			i += 2
		default:
			b.WriteByte(c)
		}
	}
	path = b.String()
	return path, ContainerKey(path) == key
}

// Paths of one container's control block files.
func LimitsPath(controlDir, key string) string { return filepath.Join(controlDir, key, "limits") }
func UsagePath(controlDir, key string) string  { return filepath.Join(controlDir, key, "usage") }
