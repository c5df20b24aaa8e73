package kube

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// fakeAPI answers GETs from a path → JSON map; anything else is a 404.
func fakeAPI(t *testing.T, objs map[string]any) *Client {
	return fakeAPIWrites(t, objs, nil)
}

// fakeAPIWrites is fakeAPI that also records each write ("PATCH /path")
// in writes, when not nil.
func fakeAPIWrites(t *testing.T, objs map[string]any, writes *[]string) *Client {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && writes != nil {
			*writes = append(*writes, r.Method+" "+r.URL.Path)
		}
		o, ok := objs[r.URL.Path]
		if !ok {
			w.WriteHeader(http.StatusNotFound)
			json.NewEncoder(w).Encode(map[string]string{"reason": "NotFound", "message": r.URL.Path + " not found"})
			return
		}
		json.NewEncoder(w).Encode(o)
	}))
	t.Cleanup(srv.Close)
	return &Client{ep: endpoint{server: srv.URL}, tokens: &tokens{}, hc: srv.Client(), log: slog.New(slog.DiscardHandler), Attempts: 1}
}

func cvAt(version string, conds ...map[string]string) map[string]any {
	return map[string]any{"status": map[string]any{
		"history":    []any{map[string]string{"state": "Completed", "version": version}},
		"conditions": conds,
	}}
}

func TestPreflightPath_RefusesAGapNamingTheMissingMinor(t *testing.T) {
	for _, c := range []struct {
		name, at string
		path     []string
		refusal  string
	}{
		{"EUS to EUS", "4.16.3", []string{"4.17.20", "4.18.10"}, ""},
		{"4.last to 5.0", "4.21.7", []string{"4.22.3", "5.0.0"}, ""},
		{"the cluster is a minor behind the path", "4.15.9", []string{"4.17.20", "4.18.10"}, "skips 4.16"},
		{"a gap inside the path", "4.16.3", []string{"4.17.20", "4.19.1"}, "skips 4.18"},
		{"a downgrade", "4.18.3", []string{"4.17.20", "4.18.10"}, "does not downgrade"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cl := fakeAPI(t, map[string]any{clusterVersionPath: cvAt(c.at), "/api/v1/pods": map[string]any{"items": []any{}}})
			p, err := cl.PreflightPath(t.Context(), "node-a", c.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			got := strings.Join(p.Refusals, "; ")
			if c.refusal == "" && got != "" || c.refusal != "" && !strings.Contains(got, c.refusal) {
				t.Errorf("refusals %q, want %q", got, c.refusal)
			}
		})
	}
}

func TestPreflight_VersionRules(t *testing.T) {
	notUpgradeable := map[string]string{"type": "Upgradeable", "status": "False", "reason": "AdminAckRequired", "message": "Kubernetes 1.32 removes APIs"}
	for _, c := range []struct {
		name, at, to string
		conds        []map[string]string
		refusal      string
	}{
		{"z-stream", "4.20.3", "4.20.5", []map[string]string{notUpgradeable}, ""},
		{"minor", "4.20.3", "4.21.0", nil, ""},
		{"same", "4.20.3", "4.20.3", nil, "at 4.20.3 already"},
		{"downgrade", "4.20.3", "4.20.1", nil, "does not downgrade"},
		{"skipped minor", "4.19.3", "4.21.0", nil, "skips 4.20"},
		{"4.last to 5.0, as the version operator allows", "4.22.3", "5.0.0", nil, ""},
		{"4 to 5.1", "4.22.3", "5.1.0", nil, "crosses a major version"},
		{"to 5.0 while not upgradeable", "4.22.3", "5.0.0", []map[string]string{notUpgradeable}, "Kubernetes 1.32 removes APIs"},
		{"minor while not upgradeable", "4.20.3", "4.21.0", []map[string]string{notUpgradeable}, "Kubernetes 1.32 removes APIs"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cl := fakeAPI(t, map[string]any{clusterVersionPath: cvAt(c.at, c.conds...), "/api/v1/pods": map[string]any{"items": []any{}}})
			p, err := cl.Preflight(t.Context(), "node-a", c.to, nil)
			if err != nil {
				t.Fatal(err)
			}
			got := strings.Join(p.Refusals, "; ")
			if c.refusal == "" && got != "" || c.refusal != "" && !strings.Contains(got, c.refusal) {
				t.Errorf("refusals %q, want %q", got, c.refusal)
			}
		})
	}
}

func TestPreflight_AdminAcksOfTheCurrentMinorAreRequired(t *testing.T) {
	objs := map[string]any{
		clusterVersionPath: cvAt("4.20.3"),
		adminGatesPath: map[string]any{"data": map[string]string{
			"ack-4.20-kube-1.34-api-removals-in-4.21": "Kubernetes 1.34 removes v1beta1 APIs",
			"ack-4.19-old-gate":                       "a gate of another minor",
		}},
		adminAcksPath:  map[string]any{"data": map[string]string{}},
		"/api/v1/pods": map[string]any{"items": []any{}},
	}
	p, err := fakeAPI(t, objs).Preflight(t.Context(), "node-a", "4.21.0", nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Refusals) != 1 || !strings.Contains(p.Refusals[0], "ack-4.20-kube-1.34-api-removals-in-4.21") || strings.Contains(p.Refusals[0], "4.19") {
		t.Fatalf("refusals %q", p.Refusals)
	}
	objs[adminAcksPath] = map[string]any{"data": map[string]string{"ack-4.20-kube-1.34-api-removals-in-4.21": "true"}}
	if p, err = fakeAPI(t, objs).Preflight(t.Context(), "node-a", "4.21.0", nil); err != nil || len(p.Refusals) != 0 {
		t.Fatalf("acknowledged: %q %v", p.Refusals, err)
	}
}
