package controlblock

import (
	"hash/maphash"
	"slices"
)

// snapshotCache answers a ledger read again from its last snapshot while
// the ledger's header (its container-wide counters and claims) reads the
// same. A thousand containers' ledgers are read every few seconds and most
// did nothing since; the header is 4 of a ledger's 36 KiB. Any allocation,
// launch or wait changes the header; a process starting or leaving without
// touching a GPU changes only its slot, so the slots are read again at
// least every slotsStale reads. A ledger read whole that says what the last
// snapshot says is answered with that snapshot, so one snapshot stands for
// one content: a reader may tell "unchanged" by the pointer.
type snapshotCache struct {
	last   *UsageSnapshot
	head   uint64 // the hash of the header last was read from
	reused int    // reads answered from last since it was read whole
}

// slotsStale is how many reads in a row an unchanged header is answered
// from the last snapshot.
const slotsStale = 3

// headSeed keys the header hash: a container cannot craft a header that
// hashes like its last one without being equal to it.
var headSeed = maphash.MakeSeed()

// read reads a ledger into u with readAt (its header first) and validates
// it, or answers from the last snapshot.
func (c *snapshotCache) read(u *Usage, readAt func(b []byte, off int64) error) (*UsageSnapshot, error) {
	b := usageBytes(u)
	if err := readAt(b[:usageHeader], 0); err != nil {
		return nil, err
	}
	head := maphash.Bytes(headSeed, b[:usageHeader])
	if c.last != nil && head == c.head && c.reused < slotsStale {
		c.reused++
		return c.last, nil
	}
	if err := readAt(b[usageHeader:], int64(usageHeader)); err != nil {
		return nil, err
	}
	s, err := parseUsage(u)
	if err != nil {
		*c = snapshotCache{}
		return nil, err
	}
	if c.last != nil && head == c.head && slices.Equal(s.Procs, c.last.Procs) && slices.Equal(s.Problems, c.last.Problems) {
		s = c.last // the header parsed the same: only the slots could differ
	}
	*c = snapshotCache{last: s, head: head}
	return s, nil
}
