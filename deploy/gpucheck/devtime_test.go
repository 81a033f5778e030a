package gpucheck

import (
	"os"
	"path/filepath"
	"testing"
)

func TestNewestKernelRecordIsTheHighestVersionDeclared(t *testing.T) {
	dir := t.TempDir()
	header := filepath.Join(dir, "cupti_activity.h")
	src := "typedef struct { int kind; } CUpti_ActivityKernel9;\n" +
		"typedef struct { int kind; } CUpti_ActivityKernel10;\n" +
		"/* see CUpti_ActivityKernel4 */ typedef CUpti_ActivityKernel10Extra x;\n"
	if err := os.WriteFile(header, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := newestKernelRecord(header)
	if err != nil || got != "CUpti_ActivityKernel10" {
		t.Fatalf("newestKernelRecord = %q, %v; want CUpti_ActivityKernel10", got, err)
	}
	if err := os.WriteFile(header, []byte("typedef struct { int kind; } CUpti_ActivityMemcpy6;\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := newestKernelRecord(header); err == nil {
		t.Fatalf("a header without kernel records gave %q", got)
	}
}

func TestTrainerLinesCarryTheDeviceJudge(t *testing.T) {
	cupti, events := &trainer{ready: make(chan struct{})}, &trainer{ready: make(chan struct{})}
	for _, tr := range []*trainer{cupti, events} {
		tr.readyOnce = func() {}
	}
	for _, l := range []string{"devtime cupti", "ready", "progress 1796405725.5 208 29.000 20.000", "devtime_dropped 3"} {
		cupti.line(l)
	}
	for _, l := range []string{"devtime events: CUPTI: CUPTI_ERROR_INSUFFICIENT_PRIVILEGES", "progress 1796405725.5 64 10.5"} {
		events.line(l)
	}
	_, n, dev, busy, err := cupti.progress()
	if err != nil || n != 208 || dev != 29 || busy != 20 {
		t.Fatalf("cupti trainer's progress: %v images, %v device ms, %v busy ms, %v", n, dev, busy, err)
	}
	if _, _, dev, busy, _ := events.progress(); dev != 10.5 || busy != 0 {
		t.Fatalf("events trainer's progress: %v device ms, %v busy ms", dev, busy)
	}
	if j := judgeOf([]*trainer{cupti, cupti}); !j.cupti || j.name != "CUPTI's stretches; container a: CUPTI dropped 3 records; container b: CUPTI dropped 3 records" {
		t.Fatalf("both by CUPTI: %+v", j)
	}
	if j := judgeOf([]*trainer{cupti, events}); j.cupti || j.name != "CUDA events; container b: events: CUPTI: CUPTI_ERROR_INSUFFICIENT_PRIVILEGES; container a: CUPTI dropped 3 records" {
		t.Fatalf("one by events: %+v", j)
	}
}
