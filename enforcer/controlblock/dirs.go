package controlblock

import (
	"errors"
	"io"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"
)

// Dirs lists the container directories under a control directory. A node
// with a thousand containers would otherwise read a thousand entries twice
// a second to find the one that is new: Dirs reads them again only when the
// directory's own stat changed, when that stat is too recent to trust (a
// timestamp's granularity can hide a second change in the same tick), and
// at least every relist.
type Dirs struct {
	path string

	mu     sync.Mutex
	stamp  dirStamp
	at     time.Time // when names was read
	names  []string
	listed bool
	gen    uint64 // counts the listings that differed from the one before
}

// relist bounds how long a listing is trusted without reading it again.
const relist = 10 * time.Second

// recentChange: a directory changed this recently may change again within
// the same timestamp tick, so its listing is not kept.
const recentChange = time.Second

type dirStamp struct {
	ino, nlink   uint64
	mtime, ctime syscall.Timespec
}

// NewDirs lists the directories under path.
func NewDirs(path string) *Dirs { return &Dirs{path: path} }

// Names returns the names of the subdirectories, sorted (the caller must
// not modify the slice), and a generation that changes when they do. A
// control directory that does not exist yet has none.
func (d *Dirs) Names() ([]string, uint64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var st syscall.Stat_t
	if err := syscall.Stat(d.path, &st); err != nil {
		d.set(nil)
		if errors.Is(err, syscall.ENOENT) {
			return nil, d.gen, nil
		}
		return nil, d.gen, &os.PathError{Op: "stat", Path: d.path, Err: err}
	}
	stamp := dirStamp{ino: st.Ino, nlink: uint64(st.Nlink), mtime: st.Mtim, ctime: st.Ctim}
	now := time.Now()
	changed := time.Unix(st.Mtim.Unix())
	if d.listed && stamp == d.stamp && now.Sub(d.at) < relist && d.at.Sub(changed) > recentChange {
		return d.names, d.gen, nil
	}
	names, err := subdirs(d.path)
	if err != nil {
		d.set(nil)
		return nil, d.gen, err
	}
	d.set(names)
	d.stamp, d.at, d.listed = stamp, now, true
	return names, d.gen, nil
}

// set makes names the listing (nil: none to trust).
func (d *Dirs) set(names []string) {
	if !slices.Equal(names, d.names) {
		d.gen++
	}
	d.names, d.listed = names, names != nil
}

// subdirs reads the sorted names of path's subdirectories, without a stat
// per entry (the entry's type comes with it).
func subdirs(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var names []string
	for {
		ents, err := f.ReadDir(1024)
		for _, e := range ents {
			if e.IsDir() {
				names = append(names, e.Name())
			}
		}
		if errors.Is(err, io.EOF) {
			slices.Sort(names)
			return names, nil
		}
		if err != nil {
			return nil, err
		}
	}
}
