package interposer_test

import (
	"bufio"
	"errors"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/gpuwarden/gpuwarden/simgpu/simtest"
)

// TestTCPCeilingProgram: gw-tcp, the remote bench's plain-TCP ceiling,
// measures a round trip and both directions' bandwidth over loopback, and
// refuses bad arguments with exit 2 and a reason.
func TestTCPCeilingProgram(t *testing.T) {
	bin := simtest.Bin(t, "interposer/gw-tcp")
	serve := exec.Command(bin, "serve", "127.0.0.1:0")
	out, err := serve.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = serve.Process.Kill(); _ = serve.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	port, perr := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "listening ")))
	if err != nil || perr != nil || port <= 0 {
		t.Fatalf("serve printed %q (%v)", line, err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	client, err := exec.Command(bin, "client", addr, "200", "4").CombinedOutput()
	if err != nil {
		t.Fatalf("client: %v: %s", err, client)
	}
	got := map[string]float64{}
	for _, m := range benchValue.FindAllStringSubmatch(string(client), -1) {
		got[m[1]], _ = strconv.ParseFloat(m[2], 64)
	}
	t.Logf("%v", got)
	if v := got["tcp_round_trip_us"]; v <= 0 || v > 100000 {
		t.Errorf("round trip %v us, want 0-100000", v)
	}
	for _, k := range []string{"tcp_send_mib_per_sec", "tcp_recv_mib_per_sec"} {
		if got[k] < 1 {
			t.Errorf("%s = %v, want at least 1 MiB/s", k, got[k])
		}
	}
	if v, ok := got["tcp_ktls_available"]; !ok || (v != 0 && v != 1) {
		t.Errorf("tcp_ktls_available = %v (printed: %v), want 0 or 1", v, ok)
	}
	for _, bad := range [][]string{{"client", addr, "0", "4"}, {"client", addr, "10", "x"}, {"client", "nocolon", "1", "1"}, {"serve"}} {
		out, err := exec.Command(bin, bad...).CombinedOutput()
		var ee *exec.ExitError
		reason := strings.HasPrefix(string(out), "gw-tcp") || strings.HasPrefix(string(out), "usage")
		if !errors.As(err, &ee) || ee.ExitCode() != 2 || !reason {
			t.Errorf("gw-tcp %v: %v %q, want exit 2 with a reason", bad, err, out)
		}
	}
}
