package admission

import (
	"strings"
	"testing"

	"github.com/gpuwarden/gpuwarden/enforcer/remote/pki"
)

func TestCheckPriority(t *testing.T) {
	r := Rules{HighPriority: []string{"ml", "infra/serve-*/main", "ops/db-0"}}
	for _, c := range []struct {
		id   pki.Identity
		want bool
	}{
		{pki.Identity{Namespace: "ml", Pod: "train-0", Container: "main"}, true},
		{pki.Identity{Namespace: "infra", Pod: "serve-1", Container: "main"}, true},
		{pki.Identity{Namespace: "infra", Pod: "serve-1", Container: "sidecar"}, false},
		{pki.Identity{Namespace: "ops", Pod: "db-0", Container: "x"}, true},
		{pki.Identity{Namespace: "ops", Pod: "db-01", Container: "x"}, false},
		{pki.Identity{Namespace: "mlx", Pod: "a", Container: "b"}, false},
	} {
		err := r.CheckPriority(c.id, true)
		if (err == nil) != c.want {
			t.Errorf("%s asking for high: %v, want allowed %v", c.id, err, c.want)
		}
		if err := r.CheckPriority(c.id, false); err != nil {
			t.Errorf("%s asking for normal: %v", c.id, err)
		}
	}
	if err := (Rules{}).CheckPriority(pki.Identity{Namespace: "a", Pod: "b", Container: "c"}, true); err == nil ||
		!strings.Contains(err.Error(), "remote.highPriority") {
		t.Errorf("no rules, high asked: %v, want refused", err)
	}
}

func TestCheckHeld(t *testing.T) {
	id := pki.Identity{Namespace: "a", Pod: "b", Container: "c"}
	if err := (Rules{SessionsPerClient: 2}).CheckHeld(id, 1); err != nil {
		t.Errorf("second of two: %v", err)
	}
	if err := (Rules{SessionsPerClient: 2}).CheckHeld(id, 2); err == nil || !strings.Contains(err.Error(), "a/b/c holds 2 sessions") {
		t.Errorf("third of two: %v", err)
	}
	if (Rules{}).CheckHeld(id, DefaultSessionsPerClient-1) != nil || (Rules{}).CheckHeld(id, DefaultSessionsPerClient) == nil {
		t.Errorf("unset: want the default, %d", DefaultSessionsPerClient)
	}
}

func TestCheckPattern(t *testing.T) {
	for p, ok := range map[string]bool{"ml": true, "*": true, "ml/*/main": true, "ml/train-[0-9]": true,
		"": false, "ml/": false, "/ml": false, "a/b/c/d": false, "ml/[": false} {
		if err := CheckPattern(p); (err == nil) != ok {
			t.Errorf("CheckPattern(%q) = %v, want ok %v", p, err, ok)
		}
	}
}
