package session

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestRequestCheck(t *testing.T) {
	for _, c := range []struct {
		r   Request
		err string
	}{
		{r: Request{MemoryFraction: 0.5}},
		{r: Request{MemoryBytes: 8 << 30, Weight: 2, Priority: "high", GPU: "GPU-x"}},
		{r: Request{MemoryFraction: 0.5, Weight: 1001}, err: "weight"},
		{r: Request{MemoryFraction: 0.5, Weight: -1}, err: "weight"},
		{r: Request{MemoryFraction: 0.5, Priority: "urgent"}, err: "priority"},
		{r: Request{}, err: "memory"},
		{r: Request{MemoryFraction: 1.5}, err: "memory fraction"},
		{r: Request{MemoryFraction: -0.5}, err: "memory fraction"},
		{r: Request{MemoryFraction: 0.5, MemoryBytes: 1 << 30}, err: "not both"},
	} {
		v, err := c.r.Check()
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%+v: err %v, want %q", c.r, err, c.err)
			}
			continue
		}
		if err != nil || v.Weight < 1 {
			t.Errorf("%+v: %+v %v", c.r, v, err)
		}
	}
}

func TestPlace(t *testing.T) {
	const gi = 1 << 30
	devs := []Device{
		{Index: 0, UUID: "GPU-a", TotalBytes: 16 * gi, UsedBytes: 2 * gi, Granted: 10 * gi},
		{Index: 1, UUID: "GPU-b", TotalBytes: 16 * gi, UsedBytes: 4 * gi},
	}
	if f := devs[0].Free(); f != 6*gi {
		t.Fatalf("free of a GPU with 10Gi granted: %d", f)
	}
	for _, c := range []struct {
		req     Request
		gpu     string
		bytes   uint64
		errPart string
	}{
		{req: Request{MemoryFraction: 0.5}, gpu: "GPU-b", bytes: 8 * gi},
		{req: Request{MemoryBytes: 6 * gi, GPU: "GPU-a"}, gpu: "GPU-a", bytes: 6 * gi},
		{req: Request{MemoryBytes: 7 * gi, GPU: "GPU-a"}, errPart: "free"},
		{req: Request{MemoryFraction: 0.5, GPU: "GPU-z"}, errPart: "no GPU GPU-z"},
		{req: Request{MemoryBytes: 13 * gi}, errPart: "not enough free memory"},
		{req: Request{MemoryFraction: 1}, errPart: "not enough free memory"},
	} {
		v, err := c.req.Check()
		if err != nil {
			t.Fatal(err)
		}
		p, err := Place(v, devs)
		if c.errPart != "" {
			if err == nil || !strings.Contains(err.Error(), c.errPart) {
				t.Errorf("%+v: err %v, want %q", c.req, err, c.errPart)
			}
			continue
		}
		if err != nil || p.Device.UUID != c.gpu || p.MemoryBytes != c.bytes {
			t.Errorf("%+v: %s %d %v, want %s %d", c.req, p.Device.UUID, p.MemoryBytes, err, c.gpu, c.bytes)
		}
	}
	if _, err := Place(Valid{Fraction: 0.5}, nil); err == nil {
		t.Error("placed on a server without GPUs")
	}
}

func TestDecodeIsStrict(t *testing.T) {
	var r Request
	for _, bad := range []string{`{"memory":"0.5","namespace":"kube-system"}`, `{"memory":"0.5"} {}`, `[]`, ``,
		`{"memory":"0.5","weight":"2"}`} {
		if err := Decode([]byte(bad), &r); err == nil {
			t.Errorf("%s: decoded", bad)
		}
	}
	if err := Decode([]byte(strings.Repeat(" ", MaxMessage+1)), &r); err == nil {
		t.Error("decoded an oversized message")
	}
}

func FuzzRequest(f *testing.F) {
	f.Add([]byte(`{"memory":"0.5","weight":2,"priority":"high","gpu":"GPU-1"}`))
	f.Add([]byte(`{"memory":"8Gi"}`))
	f.Add([]byte(`{"memory":"1.0000000000000002"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var r Request
		if Decode(b, &r) != nil {
			return
		}
		v, err := r.Check()
		if err != nil {
			return
		}
		if v.Weight < 1 || v.Weight > 1000 || (v.Bytes == 0) == (v.Fraction == 0) || v.Fraction > 1 || v.Fraction < 0 {
			t.Fatalf("accepted %+v from %s", v, b)
		}
		p, err := Place(v, []Device{{UUID: "GPU-1", TotalBytes: 16 << 30}})
		if err == nil && (p.MemoryBytes == 0 || p.MemoryBytes > 16<<30) {
			t.Fatalf("granted %d bytes for %s", p.MemoryBytes, b)
		}
		if _, err := json.Marshal(r); err != nil {
			t.Fatal(err)
		}
	})
}

// FuzzAnswers: a client reads what any server sends without failing in
// any way but an error.
func FuzzAnswers(f *testing.F) {
	f.Add([]byte(`{"session":"s-1","gpu":"GPU-1","memoryBytes":8589934592,"weight":2,"priority":"high"}`))
	f.Add([]byte(`{"node":"n","gpus":[{"index":0,"uuid":"GPU-1","name":"x","totalBytes":1,"freeBytes":1}]}`))
	f.Add([]byte(`{"error":"not enough free memory"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var w Welcome
		var l GPUList
		_ = Decode(b, &w)
		_ = Decode(b, &l)
	})
}
