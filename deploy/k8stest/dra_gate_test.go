package k8stest

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/gpuwarden/gpuwarden/deploy/k8stest/kube"
)

// TestDRAWithoutConsumableCapacity: an API server with the
// DRAConsumableCapacity feature gate off (a second one, on the cluster's
// etcd under a prefix of its own, the same binary) drops what makes a GPU
// shareable from the agent's ResourceSlice. The agent must not call itself
// ready, and /readyz must name the gate: claims would otherwise get whole
// GPUs, one each, without anyone being told.
func TestDRAWithoutConsumableCapacity(t *testing.T) {
	c := needCluster(t)
	dir := t.TempDir()
	port := freePort(t)
	server := fmt.Sprintf("https://127.0.0.1:%d", port)
	token := filepath.Join(dir, "token")
	if err := os.WriteFile(token, []byte("gpuwarden-gate-test\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokens.csv"), []byte("gpuwarden-gate-test,agent,agent,system:masters\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	pki := filepath.Join(c.State, "pki")
	startLogged(t, filepath.Join(dir, "apiserver.log"), exec.Command(filepath.Join(filepath.Dir(c.Kubectl), "kube-apiserver"),
		"--etcd-servers", "http://127.0.0.1:2379", "--etcd-prefix", "/gpuwarden-gate-test-"+fmt.Sprint(os.Getpid()),
		"--secure-port", fmt.Sprint(port), "--bind-address", "127.0.0.1", "--advertise-address", "10.213.0.1",
		"--service-cluster-ip-range", "10.97.0.0/24",
		"--tls-cert-file", filepath.Join(pki, "apiserver.crt"), "--tls-private-key-file", filepath.Join(pki, "apiserver.key"),
		"--client-ca-file", filepath.Join(pki, "ca.crt"), "--token-auth-file", filepath.Join(dir, "tokens.csv"),
		"--authorization-mode", "AlwaysAllow", "--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", filepath.Join(pki, "sa.pub"), "--service-account-signing-key-file", filepath.Join(pki, "sa.key"),
		"--cert-dir", filepath.Join(dir, "apiserver-certs"), "--profiling=false",
		"--feature-gates", "DRAConsumableCapacity=false"))
	client, err := kubernetes.NewForConfig(&rest.Config{Host: server, BearerTokenFile: token,
		TLSClientConfig: rest.TLSClientConfig{CAFile: filepath.Join(pki, "ca.crt")}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	kube.Eventually(t, 3*time.Minute, "the second API server serves resource.k8s.io/v1", func() error {
		_, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		return err
	})
	// The node the slice names (no kubelet behind it: the agent only publishes).
	if _, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: c.Node}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	listen := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	agent := exec.Command(kube.Bin(t, "gpuwarden"), "agent", "--listen", listen)
	agent.Env = append(ownEnv(),
		"SIMGPU_STATE="+filepath.Join(dir, "simgpu.state"), "SIMGPU_DEVICES=1", "SIMGPU_MEMORY="+simMemory,
		"GPUWARDEN_NVML_LIBRARY="+kube.Bin(t, "simgpu/libnvidia-ml.so.1"),
		"GPUWARDEN_EBPF_ENABLED=false", "GPUWARDEN_ENFORCEMENT_ENABLED=false",
		"GPUWARDEN_CONTROL_DIR="+filepath.Join(dir, "control"),
		"GPUWARDEN_DRA_ENABLED=true", "GPUWARDEN_DRA_CDI_DIR="+filepath.Join(dir, "cdi"),
		"GPUWARDEN_DRA_REGISTRAR_DIR="+filepath.Join(dir, "registry"), "GPUWARDEN_DRA_PLUGIN_DIR="+filepath.Join(dir, "plugin"),
		"GPUWARDEN_DEVICE_PLUGIN_INTERPOSER_PATH="+kube.Bin(t, "libgpuwarden.so"),
		"GPUWARDEN_KUBERNETES_API_SERVER="+server, "GPUWARDEN_KUBERNETES_TOKEN_FILE="+token,
		"GPUWARDEN_KUBERNETES_CA_FILE="+filepath.Join(pki, "ca.crt"), "GPUWARDEN_NODE_NAME="+c.Node,
		"GPUWARDEN_KUBELET_POD_RESOURCES_SOCKET="+filepath.Join(dir, "no-kubelet.sock"))
	startLogged(t, filepath.Join(dir, "agent.log"), agent)
	var why string
	kube.Eventually(t, 2*time.Minute, "/readyz names the missing gate", func() error {
		ready, parts, err := readyz(listen)
		if err != nil {
			return err
		}
		why = parts["dra"].Error
		if ready || !strings.Contains(why, "feature gate DRAConsumableCapacity is off") {
			return fmt.Errorf("ready %v, dra part %+v", ready, parts["dra"])
		}
		return nil
	})
	t.Logf("/readyz: dra: %s", why)
	// And it stays so: no fallback to a GPU per claim.
	time.Sleep(3 * time.Second)
	if ready, parts, err := readyz(listen); err != nil || ready || parts["dra"].Up {
		t.Errorf("after 3 s more: ready %v, dra %+v (%v)", ready, parts["dra"], err)
	}
}

// partState is what /readyz says of one of the agent's parts.
type partState struct {
	Enabled, Up bool
	Error       string
}

func readyz(addr string) (bool, map[string]partState, error) {
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		return false, nil, err
	}
	defer resp.Body.Close()
	var r struct {
		Ready bool                 `json:"ready"`
		Parts map[string]partState `json:"parts"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return false, nil, err
	}
	return r.Ready, r.Parts, nil
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
