package kube

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestPoolOf_TheMCOsChoiceOfPool(t *testing.T) {
	var pools []pool
	if err := json.Unmarshal([]byte(`[
	 {"metadata":{"name":"master"},"spec":{"nodeSelector":{"matchLabels":{"node-role.kubernetes.io/master":""}}}},
	 {"metadata":{"name":"worker"},"spec":{"nodeSelector":{"matchLabels":{"node-role.kubernetes.io/worker":""}}}},
	 {"metadata":{"name":"infra"},"spec":{"nodeSelector":{"matchExpressions":[{"key":"node-role.kubernetes.io/infra","operator":"Exists"}]}}},
	 {"metadata":{"name":"gpu"},"spec":{"nodeSelector":{"matchExpressions":[{"key":"accel","operator":"In","values":["a100","h100"]}]}}},
	 {"metadata":{"name":"none"},"spec":{}}
	]`), &pools); err != nil {
		t.Fatal(err)
	}
	for want, labels := range map[string]map[string]string{
		"worker": {"node-role.kubernetes.io/worker": ""},
		"infra":  {"node-role.kubernetes.io/worker": "", "node-role.kubernetes.io/infra": ""},
		"master": {"node-role.kubernetes.io/master": "", "node-role.kubernetes.io/worker": ""},
		"gpu":    {"node-role.kubernetes.io/worker": "", "accel": "h100"},
		"":       {"accel": "t4"},
	} {
		got := ""
		if p := poolOf(pools, labels); p != nil {
			got = p.Metadata.Name
		}
		if got != want {
			t.Errorf("labels %v: pool %q, want %q", labels, got, want)
		}
	}
}

// TestMachineCount_SumsThePoolsAndKnowsNoneWithoutThem: the MCO's count
// of nodes is every pool's status.machineCount; no CRD (404) or no pool
// is a cluster without the MCO, whose count is not known; a refusal is
// an error, never a count of zero.
func TestMachineCount_SumsThePoolsAndKnowsNoneWithoutThem(t *testing.T) {
	pools := map[string]any{"items": []any{
		map[string]any{"metadata": map[string]any{"name": "master"}, "status": map[string]any{"machineCount": 3}},
		map[string]any{"metadata": map[string]any{"name": "worker"}, "status": map[string]any{"machineCount": 2}},
		map[string]any{"metadata": map[string]any{"name": "new"}}, // no status yet
	}}
	if n, known, err := fakeAPI(t, map[string]any{poolsPath: pools}).MachineCount(t.Context()); n != 5 || !known || err != nil {
		t.Errorf("pools of 3 and 2: %d %v %v, want 5 true", n, known, err)
	}
	if n, known, err := fakeAPI(t, map[string]any{}).MachineCount(t.Context()); n != 0 || known || err != nil {
		t.Errorf("no MCP CRD: %d %v %v, want unknown", n, known, err)
	}
	if _, known, err := fakeAPI(t, map[string]any{poolsPath: map[string]any{"items": []any{}}}).MachineCount(t.Context()); known || err != nil {
		t.Errorf("no pool: %v %v, want unknown", known, err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusForbidden)
		json.NewEncoder(w).Encode(map[string]string{"reason": "Forbidden", "message": "machineconfigpools is forbidden"})
	}))
	defer srv.Close()
	c := &Client{ep: endpoint{server: srv.URL}, tokens: &tokens{}, hc: srv.Client(), log: slog.New(slog.DiscardHandler), Attempts: 1}
	f := &Follower{c: c}
	if _, known, err := f.MachineCount(t.Context()); known || err == nil {
		t.Errorf("forbidden: %v %v, want an error", known, err)
	}
}
