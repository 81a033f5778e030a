package controlblock

import (
	"encoding/binary"
	"testing"
	"unsafe"
)

// validLedger is a ledger as the interposer lays it out, with one live process.
func validLedger() []byte {
	var u Usage
	u.Magic, u.ABIMajor, u.Size = UsageMagic, ABIMajor, uint32(UsageSize)
	u.MaxDevices, u.MaxSlots, u.SlotSize, u.NDev = MaxDevices, MaxSlots, uint32(unsafe.Sizeof(Slot{})), 2
	u.ReservedBytes[0] = 3 << 30
	u.ClaimWeight = 1
	copy(u.CgroupPath[:], "/gpuwarden-test/x")
	u.Slots[3] = Slot{State: SlotLive, Pid: 42, StartTime: 7}
	u.Slots[3].Bytes[0] = 3 << 30
	return append([]byte(nil), unsafe.Slice((*byte)(unsafe.Pointer(&u)), UsageSize)...)
}

func TestParseUsage(t *testing.T) {
	s, err := ParseUsage(validLedger())
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Procs) != 1 || s.Procs[0].Pid != 42 || s.Procs[0].Bytes[0] != 3<<30 || s.CgroupPath != "/gpuwarden-test/x" ||
		s.NDev != 2 || len(s.Problems) != 0 {
		t.Fatalf("snapshot %+v", s)
	}

	// garbage fields are dropped and named, never trusted
	b := validLedger()
	off := int(unsafe.Offsetof(Usage{}.Slots)) + 5*int(unsafe.Sizeof(Slot{}))
	binary.LittleEndian.PutUint32(b[off:], 9) // slot 5: unknown state
	off = int(unsafe.Offsetof(Usage{}.Slots)) + 6*int(unsafe.Sizeof(Slot{}))
	binary.LittleEndian.PutUint32(b[off:], SlotLive) // slot 6: live, pid 0
	binary.LittleEndian.PutUint64(b[unsafe.Offsetof(Usage{}.ReservedBytes)+8:], 1<<60)
	for i := range 512 {
		b[int(unsafe.Offsetof(Usage{}.CgroupPath))+i] = 'x' // no NUL
	}
	s, err = ParseUsage(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Procs) != 1 || len(s.Problems) != 4 || s.ReservedBytes[1] != 0 || s.CgroupPath != "" {
		t.Fatalf("garbage accepted: procs %d problems %q", len(s.Procs), s.Problems)
	}

	for _, bad := range [][]byte{nil, make([]byte, UsageSize), validLedger()[:100]} {
		if _, err := ParseUsage(bad); err == nil {
			t.Errorf("accepted %d bytes of non-ledger", len(bad))
		}
	}
}

// FuzzParseUsage: any bytes give a snapshot or an error, never a panic, and
// nothing implausible gets through.
func FuzzParseUsage(f *testing.F) {
	f.Add(validLedger())
	f.Add([]byte{})
	f.Add(validLedger()[:4096])
	f.Fuzz(func(t *testing.T, b []byte) {
		// keep the header valid most of the time, so the fuzzer reaches the fields
		if len(b) >= 32 && b[0]&1 == 1 {
			v := validLedger()
			copy(v[32:], b[32:])
			b = v
		}
		s, err := ParseUsage(b)
		if err != nil {
			return
		}
		for d := 0; d < MaxDevices; d++ {
			if s.ReservedBytes[d] > MaxPlausibleBytes {
				t.Fatal("implausible reserved bytes accepted")
			}
		}
		for _, p := range s.Procs {
			if p.Pid <= 0 || p.Slot < 0 || p.Slot >= MaxSlots {
				t.Fatalf("bad process accepted: %+v", p)
			}
		}
		if s.NDev > MaxDevices || s.ClaimComputeLimit > 100 {
			t.Fatal("implausible claims accepted")
		}
	})
}

// TestParseUsagePerDeviceByMinor: the per-device launch counters (minor 1)
// are read from ledgers of minor 1 on; in an older ledger that space is
// reserved, and whatever it holds is not read.
func TestParseUsagePerDeviceByMinor(t *testing.T) {
	for _, minor := range []uint16{0, 1} {
		b := validLedger()
		u := (*Usage)(unsafe.Pointer(&b[0]))
		u.ABIMinor = minor
		u.LaunchesDev[1], u.ThrottledNsDev[1] = 70, 3e9
		u.Slots[3].Launches, u.Slots[3].LaunchesPlaced = 80, 70
		u.Slots[3].ThrottledNs, u.Slots[3].ThrottledPlacedNs = 3e9, 3e9
		s, err := ParseUsage(b)
		if err != nil {
			t.Fatal(err)
		}
		p := s.Procs[0]
		got := [4]uint64{s.LaunchesDev[1], s.ThrottledNsDev[1], p.LaunchesPlaced, p.ThrottledPlacedNs}
		want := [4]uint64{70, 3e9, 70, 3e9}
		if minor == 0 {
			want = [4]uint64{}
		}
		if s.PerDevice() != (minor >= 1) || got != want || p.Launches != 80 {
			t.Errorf("minor %d: per device %v, counters %v, launches %d; want %v, 80", minor, s.PerDevice(), got, p.Launches, want)
		}
	}
}

// TestParseUsageDevMismatchesByMinor: the device mismatch count (minor 2) is
// read from ledgers of minor 2 on; an older ledger's reserved space there is
// not read.
func TestParseUsageDevMismatchesByMinor(t *testing.T) {
	for _, minor := range []uint16{1, 2} {
		b := validLedger()
		u := (*Usage)(unsafe.Pointer(&b[0]))
		u.ABIMinor = minor
		u.DevMismatches = 5
		s, err := ParseUsage(b)
		if err != nil {
			t.Fatal(err)
		}
		if want := map[uint16]uint64{1: 0, 2: 5}[minor]; s.DevMismatches != want {
			t.Errorf("minor %d: %d mismatches, want %d", minor, s.DevMismatches, want)
		}
	}
}
