package vocab

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/gpuwarden/gpuwarden/enforcer/policy"
)

// reader is one of the package's Parse and Check functions, called on a
// value written as a string.
type reader struct {
	call      func(string) error
	good, bad []string
}

func intArg(check func(int) error) func(string) error {
	return func(s string) error {
		n, err := strconv.Atoi(s)
		if err != nil {
			panic(err)
		}
		return check(n)
	}
}

// readers lists every exported Parse and Check function of the package, with
// values each must take and refuse; TestEveryReaderListed fails on one
// missing here.
var readers = map[string]reader{
	"ParseWeight": {func(s string) error { _, err := ParseWeight(s); return err },
		[]string{"1", "1000", "01000"}, []string{"0", "1001", "", "+5", " 5", "5x", "-1", "0x10", "99999999999999999999"}},
	"CheckWeight": {intArg(CheckWeight), []string{"1", "1000"}, []string{"0", "1001", "-1"}},
	"ParseCapPercent": {func(s string) error { _, err := ParseCapPercent(s); return err },
		[]string{"1", "100", "30%", "000050%"}, []string{"0", "101", "101%", "%", "", "30%%", "-5", "3 0"}},
	"CheckCapPercent": {intArg(CheckCapPercent), []string{"1", "100"}, []string{"0", "101", "-1"}},
	"ParsePriority": {func(s string) error { _, err := ParsePriority(s); return err },
		[]string{"high", "normal"}, []string{"", "High", "urgent", "high "}},
	"ParsePolicy": {func(s string) error { _, err := ParsePolicy(s); return err },
		[]string{"0", "5", "weighted", " Native ", "FAIR-SHARE"}, []string{"6", "-1", "", "weight", "02x"}},
	"CheckMaxInst": {intArg(CheckMaxInst), []string{"1", "128"}, []string{"0", "129", "-1"}},
	"ParseSize": {func(s string) error { _, err := ParseSize(s); return err },
		[]string{"0", "6Gi", "512Mi", "2048Ki", "1Ti", "2", "18014398509481983Ki"},
		[]string{"", "18014398509481984Ki", "6GB", "1gi", " 1Gi", "Gi", "-1", "1.5Gi", "1Pi", "18446744073709551616", "17179869184Gi"}},
	"ParseGiB": {func(s string) error { _, err := ParseGiB(s); return err },
		[]string{"0", "3", "1048576"}, []string{"1048577", "3Gi", "", "x", "-1"}},
	"ParseMemoryList": {func(s string) error { _, err := ParseMemoryList(s, 4); return err },
		[]string{"6Gi", "3Gi,4Gi", "0,1Gi", "1,2,3,4", "0"}, []string{"", "1Gi,", ",1", "1,2,3,4,5", "3, 1", "6GB"}},
	"ParseGiBList": {func(s string) error { _, err := ParseGiBList(s, 4); return err },
		[]string{"3", "3,1", "0", "1,2,3,4"}, []string{"3Gi", "1,,2", "1048577", "", "1,2,3,4,5"}},
	"ParseMemoryRequest": {func(s string) error { _, _, err := ParseMemoryRequest(s); return err },
		[]string{"0.5", "1.0", ".25", "8Gi", "2", "1Ti"},
		[]string{"", "0", "0Gi", "0.0", "1.5", "-0.5", "1e-1", "NaN.", "8GB", "Gi", "0x1p-1.", "99999999999999999999Gi", "17179869184Gi"}},
	"ParseQuantity": {func(s string) error { _, err := ParseQuantity(s); return err },
		[]string{"15Gi", "100", "1.5k", "6442450944", "5e3", "-1m", "7Ei"},
		[]string{"", "Gi", "1GiB", "1 Gi", "1e", "1e1000", "9Ei", "0x10"}},
	"CheckFraction": {func(s string) error {
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			panic(err)
		}
		return CheckFraction(f)
	}, []string{"0.5", "1", "1e-9"}, []string{"0", "1.5", "-0.1", "NaN", "+Inf"}},
	"ParseAnnotations": {func(s string) error {
		_, err := ParseAnnotations(map[string]string{AnnotationWeight: s, AnnotationComputeLimit: s + "%"}, "main")
		return err
	}, []string{"3", "100"}, []string{"0", "101", ""}},
}

// TestEveryReaderListed: every exported Parse and Check function of the
// package is in readers, so each has a test of what it takes and refuses.
func TestEveryReaderListed(t *testing.T) {
	fs := token.NewFileSet()
	var found []string
	files, _ := filepath.Glob("*.go")
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fs, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range file.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Recv == nil && regexp.MustCompile(`^(Parse|Check)[A-Z]`).MatchString(fn.Name.Name) {
				found = append(found, fn.Name.Name)
			}
		}
	}
	if len(found) < 10 {
		t.Fatalf("found only %v: the listing is broken", found)
	}
	for _, name := range found {
		if _, ok := readers[name]; !ok {
			t.Errorf("%s is not in readers: add what it takes and refuses", name)
		}
	}
	for name := range readers {
		if !slices.Contains(found, name) {
			t.Errorf("readers lists %s, which the package does not define", name)
		}
	}
}

func TestReaders(t *testing.T) {
	for name, r := range readers {
		for _, s := range r.good {
			if err := r.call(s); err != nil {
				t.Errorf("%s(%q): %v", name, s, err)
			}
		}
		for _, s := range r.bad {
			err := r.call(s)
			var e *Error
			switch {
			case err == nil:
				t.Errorf("%s(%q) accepted", name, s)
			case name != "ParseAnnotations" && !errors.As(err, &e):
				t.Errorf("%s(%q): error %v of type %T, want *Error", name, s, err, err)
			case !strings.Contains(err.Error(), "want "):
				t.Errorf("%s(%q): error %q does not say what is wanted", name, s, err)
			}
		}
	}
}

func TestValues(t *testing.T) {
	const gi, mi = 1 << 30, 1 << 20
	for s, want := range map[string]uint64{"6Gi": 6 * gi, "512Mi": 512 * mi, "2048Ki": 2 * mi, "2": 2 * gi, "1Ti": 1 << 40, "0": 0} {
		if got, err := ParseSize(s); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", s, got, err, want)
		}
	}
	if got, err := ParseMemoryList("3Gi,4Gi,5Gi", 4); err != nil || !slices.Equal(got, []uint64{3 * gi, 4 * gi, 5 * gi, 5 * gi}) {
		t.Errorf("ParseMemoryList: %v, %v (the last value repeats)", got, err)
	}
	if got, err := ParseGiBList("3,1", 3); err != nil || !slices.Equal(got, []uint64{3 * gi, gi, gi}) {
		t.Errorf("ParseGiBList: %v, %v", got, err)
	}
	for _, c := range []struct {
		in    string
		frac  float64
		bytes uint64
		why   string
	}{
		{in: "0.5", frac: 0.5}, {in: ".25", frac: 0.25}, {in: "8Gi", bytes: 8 * gi}, {in: "2", bytes: 2 * gi},
		{in: "", why: "empty"}, {in: "0", why: "zero"}, {in: "1.5", why: "at most 1"}, {in: "-0.5", why: "not a number"},
		{in: "1e-1", why: "not a size"}, {in: "17179869184Gi", why: "too large"},
	} {
		f, b, err := ParseMemoryRequest(c.in)
		if c.why != "" {
			if err == nil || !strings.Contains(err.Error(), c.why) {
				t.Errorf("ParseMemoryRequest(%q): %v, want an error saying %q", c.in, err, c.why)
			}
		} else if err != nil || f != c.frac || b != c.bytes {
			t.Errorf("ParseMemoryRequest(%q) = %v, %d, %v; want %v, %d", c.in, f, b, err, c.frac, c.bytes)
		}
	}
	for s, want := range map[string]bool{"high": true, "normal": false} {
		if high, err := ParsePriority(s); err != nil || high != want || PriorityName(high) != s {
			t.Errorf("ParsePriority(%q) = %v, %v", s, high, err)
		}
	}
	for s, want := range map[string]policy.Policy{"0": policy.FairShare, "2": policy.Weighted, "soft": policy.Soft, " Native ": policy.Native} {
		if p, err := ParsePolicy(s); err != nil || p != want {
			t.Errorf("ParsePolicy(%q) = %v, %v; want %v", s, p, err, want)
		}
	}
	if n, err := ParseCapPercent("30%"); err != nil || n != 30 {
		t.Errorf("ParseCapPercent(30%%) = %d, %v", n, err)
	}
}

// A size written by FormatSize reads back as what it was, rounded down to
// whole KiB, and never as 0 ("no limit") unless it was 0: under 1 KiB it is
// 1Ki.
func TestFormatSize(t *testing.T) {
	for b, want := range map[uint64]string{0: "0", 1 << 30: "1Gi", 1536 << 20: "1536Mi", 1025: "1Ki", 100: "1Ki"} {
		if got := FormatSize(b); got != want {
			t.Errorf("FormatSize(%d) = %q, want %q", b, got, want)
		}
	}
	for _, b := range []uint64{1, 1023, 1 << 20, 3<<30 + 5, math.MaxUint64} {
		got, err := ParseSize(FormatSize(b))
		if err != nil || got != max(b>>10<<10, 1024) {
			t.Errorf("ParseSize(FormatSize(%d)) = %d, %v", b, got, err)
		}
	}
}

func TestParseAnnotations(t *testing.T) {
	tests := []struct {
		name string
		ann  map[string]string
		want Annotated
		err  string
	}{
		{"none", nil, Annotated{}, ""},
		{"pod-wide", map[string]string{AnnotationWeight: "3", AnnotationComputeLimit: "40%", AnnotationPriority: "high"},
			Annotated{Weight: 3, CapPercent: 40, Priority: "high"}, ""},
		{"container wins", map[string]string{AnnotationWeight: "3", AnnotationWeight + ".main": "7"}, Annotated{Weight: 7}, ""},
		{"other container's ignored", map[string]string{AnnotationWeight + ".side": "7"}, Annotated{}, ""},
		{"weight zero", map[string]string{AnnotationWeight: "0"}, Annotated{}, `annotation gpuwarden.io/weight="0": want an integer from 1 to 1000`},
		{"weight too big", map[string]string{AnnotationWeight: "1001"}, Annotated{}, "1 to 1000"},
		{"weight signed", map[string]string{AnnotationWeight: "+5"}, Annotated{}, "weight"},
		{"limit 0", map[string]string{AnnotationComputeLimit: "0"}, Annotated{}, "compute-limit"},
		{"limit 101", map[string]string{AnnotationComputeLimit + ".main": "101%"}, Annotated{}, "compute-limit.main"},
		{"limit empty", map[string]string{AnnotationComputeLimit: ""}, Annotated{}, "compute-limit"},
		{"priority", map[string]string{AnnotationPriority: "urgent"}, Annotated{}, "want high or normal"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseAnnotations(tt.ann, "main")
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("got %+v, %v; want error %q", got, err, tt.err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

// FuzzParseGiBList: cGPU's list is whole GiB per device within range, and
// what it accepts reads back the same written as cGPU would write it.
func FuzzParseGiBList(f *testing.F) {
	for _, s := range []string{"3", "3,1", "3,4,5,6", "0", "1,,2", "1048577", "3Gi", strings.Repeat("1,", 16) + "1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		mem, err := ParseGiBList(s, 16)
		if err != nil {
			return
		}
		vals := make([]string, len(mem))
		for i, v := range mem {
			if v%(1<<30) != 0 || v > MaxGiB<<30 {
				t.Fatalf("ParseGiBList(%q) = %v", s, mem)
			}
			vals[i] = fmt.Sprint(v >> 30)
		}
		if again, err := ParseGiBList(strings.Join(vals, ","), 16); err != nil || !slices.Equal(again, mem) {
			t.Fatalf("ParseGiBList(%q) = %v, written back %v", s, mem, again)
		}
	})
}

// TestCHeader: the committed header is what CHeader renders from the
// constants, and the C parser takes its limits from it, not from literals.
func TestCHeader(t *testing.T) {
	b, err := os.ReadFile("../interposer/src/vocab_gen.h")
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != CHeader() {
		t.Errorf("enforcer/interposer/src/vocab_gen.h differs from enforcer/vocab's constants: run go generate ./enforcer/vocab\nwant:\n%s", CHeader())
	}
	env, err := os.ReadFile("../interposer/src/env.c")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"GW_MAX_WEIGHT", "GW_MAX_CAP_PERCENT", "GW_MAX_GIB", "GW_PRIORITY_HIGH_NAME", "GW_PRIORITY_NORMAL_NAME",
		"GW_SIZE_UNITS", "GW_SIZE_BARE_SHIFT"} {
		if !strings.Contains(string(env), name) {
			t.Errorf("env.c does not use %s", name)
		}
	}
	for _, literal := range []string{`\b1000u?\b`, `\b100u?\)`, `"high"`, `"normal"`, `'K'`, `'G'`, `<< 20\)`} {
		if regexp.MustCompile(literal).Match(env) {
			t.Errorf("env.c writes %s itself; take it from vocab_gen.h", literal)
		}
	}
}

// An error repeats a short value, and names a long one (a hostile request's
// megabytes) by its length only.
func TestErrorEchoesShortValuesOnly(t *testing.T) {
	_, short := ParsePriority("urgent")
	long := strings.Repeat("q", 1000)
	_, err := ParsePriority(long)
	if short == nil || !strings.Contains(short.Error(), `"urgent"`) {
		t.Errorf("short value: %v; want it quoted", short)
	}
	if err == nil || strings.Contains(err.Error(), "qqqq") || !strings.Contains(err.Error(), "1000 bytes") || len(err.Error()) > 200 {
		t.Errorf("long value: %q; want its length, not the value", err)
	}
}
