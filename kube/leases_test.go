package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/cluster"
)

func leaseAt(name, addr, ready string, renewed time.Time, seconds int) lease {
	var l lease
	l.Metadata.Name = name
	l.Metadata.Annotations = map[string]string{AnnotationAddress: addr, AnnotationReady: ready, AnnotationReadySince: "2026-11-28T10:00:00Z"}
	l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds, l.Spec.RenewTime = name, seconds, renewed.UTC().Format(microTime)
	return l
}

// TestLeases_ReadyOnlyWhileRenewedAndSaidSo: a node is ready when its
// record says so and was renewed within its duration; an expired one
// went not ready when it expired; a record held by another name is no
// node's.
func TestLeases_ReadyOnlyWhileRenewedAndSaidSo(t *testing.T) {
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	since := time.Date(2026, 11, 28, 10, 0, 0, 0, time.UTC)
	forged := leaseAt("node-x", "10.0.0.9", "true", now, 360)
	forged.Spec.HolderIdentity = "node-a"
	ls := []lease{
		leaseAt("node-a", "10.0.0.1", "true", now.Add(-time.Minute), 360),
		leaseAt("node-b", "10.0.0.2", "false", now, 360),
		leaseAt("node-c", "10.0.0.3", "true", now.Add(-7*time.Minute), 360),
		leaseAt("node-d", "10.0.0.4", "false", now.Add(-time.Hour), 360),
		leaseAt("node-e", "10.0.0.5", "false", now.Add(-4*time.Hour), 360),
		forged,
	}
	got := readinessOfLeases(ls, now)
	want := map[string]cluster.NodeReady{
		"node-a": {Ready: true, Since: since},
		"node-b": {Ready: false, Since: since},
		"node-c": {Ready: false, Since: now.Add(-time.Minute)},
		"node-d": {Ready: false, Since: since},                                 // said so before it expired
		"node-e": {Ready: false, Since: now.Add(-4*time.Hour + 6*time.Minute)}, // expired before the time it says
	}
	if len(got) != len(want) {
		t.Fatalf("readiness %v, want %v", got, want)
	}
	for n, w := range want {
		if g := got[n]; g.Ready != w.Ready || !g.Since.Equal(w.Since) {
			t.Errorf("%s: %+v, want %+v", n, g, w)
		}
	}
	addrs := addressesOfLeases(ls)
	if len(addrs) != 5 || addrs["node-a"] != "10.0.0.1" || addrs["node-c"] != "10.0.0.3" {
		t.Errorf("addresses %v", addrs)
	}
}

// leaseAPI plays the API server for one node's Follower: its own Node,
// the Leases, and the other collections empty; watches stay open and
// send nothing. It records every request and each Lease written.
type leaseAPI struct {
	t      *testing.T
	node   string
	mu     sync.Mutex
	asked  []string
	writes []lease
}

func (s *leaseAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	s.mu.Lock()
	s.asked = append(s.asked, r.Method+" "+r.URL.Path+" "+q.Get("fieldSelector"))
	s.mu.Unlock()
	if q.Get("watch") == "1" {
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		return
	}
	switch {
	case r.Method == "GET" && r.URL.Path == "/api/v1/nodes":
		fmt.Fprintf(w, `{"metadata":{"resourceVersion":"5"},"items":[{"metadata":{"name":%q,"uid":"uid-1","resourceVersion":"4"},
			"status":{"addresses":[{"type":"Hostname","address":"a"},{"type":"InternalIP","address":"10.0.0.1"}],
			"conditions":[{"type":"Ready","status":"True","lastTransitionTime":"2026-11-28T10:00:00Z"}]}}]}`, s.node)
	case r.Method == "POST" && r.URL.Path == leasesPath:
		var l lease
		b, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(b, &l); err != nil {
			s.t.Errorf("a lease that does not decode: %s", b)
		}
		s.mu.Lock()
		s.writes = append(s.writes, l)
		s.mu.Unlock()
		w.WriteHeader(http.StatusCreated)
		w.Write(b)
	default:
		fmt.Fprint(w, `{"metadata":{"resourceVersion":"5"},"items":[]}`)
	}
}

// keepRecord runs node-a's Follower and its KeepRecord(address) against
// api; stop ends both.
func keepRecord(t *testing.T, api *leaseAPI, address string) (stop func()) {
	srv := httptest.NewTLSServer(api)
	c := &Client{ep: endpoint{server: srv.URL}, tokens: &tokens{}, hc: srv.Client(), stream: srv.Client(), log: slog.New(slog.DiscardHandler), Attempts: 1}
	f := c.Follow("node-a")
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() { f.Run(ctx) })
	wg.Go(func() { f.KeepRecord(ctx, address) })
	var once sync.Once
	return func() { once.Do(func() { cancel(); wg.Wait(); srv.Close() }) }
}

// TestKeepRecord_WritesItsOwnLeaseFromItsOwnNodeAndReadsNoOther: the
// Follower watches its own Node only (a field selector on its name),
// never lists Nodes or pods; the record it writes is the Lease the
// ferry-lease admission policy allows: named after the node, held by it,
// owned by its Node alone, with its InternalIP and readiness.
func TestKeepRecord_WritesItsOwnLeaseFromItsOwnNodeAndReadsNoOther(t *testing.T) {
	api := &leaseAPI{t: t, node: "node-a"}
	stop := keepRecord(t, api, "")
	defer stop()

	deadline := time.Now().Add(10 * time.Second)
	for {
		api.mu.Lock()
		n := len(api.writes)
		api.mu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no lease written; asked %q", api.asked)
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond) // nothing more while nothing changes
	api.mu.Lock()
	defer api.mu.Unlock()
	if len(api.writes) != 1 {
		t.Errorf("%d writes of an unchanged record, want 1", len(api.writes))
	}
	l := api.writes[0]
	if l.Metadata.Name != "node-a" || l.Metadata.Namespace != LeaseNamespace || l.Spec.HolderIdentity != "node-a" || l.Spec.LeaseDurationSeconds != leaseSeconds {
		t.Errorf("lease %+v", l)
	}
	if len(l.Metadata.OwnerReferences) != 1 || l.Metadata.OwnerReferences[0] != (ownerRef{APIVersion: "v1", Kind: "Node", Name: "node-a", UID: "uid-1"}) {
		t.Errorf("owners %+v, want exactly node-a's Node", l.Metadata.OwnerReferences)
	}
	if a := l.Metadata.Annotations; a[AnnotationAddress] != "10.0.0.1" || a[AnnotationReady] != "true" {
		t.Errorf("annotations %v", a)
	}
	if renewed := l.renewed(); time.Since(renewed) > time.Minute {
		t.Errorf("renewTime %q", l.Spec.RenewTime)
	}
	for _, a := range api.asked {
		if strings.HasPrefix(a, "GET /api/v1/nodes ") && a != "GET /api/v1/nodes metadata.name=node-a" || strings.HasPrefix(a, "GET /api/v1/pods") {
			t.Errorf("asked %q: a kubelet reads only its own Node", a)
		}
	}
}

// TestPreflight_OwnPodsOnlyAndNoTenantNamesInTheWarning: the pods are
// listed by the node's name; the warning, which goes into the
// cluster-scoped UpgradeBundle, counts containers and names images, not a
// tenant's namespace or pod (those are the node's Details).
func TestPreflight_OwnPodsOnlyAndNoTenantNamesInTheWarning(t *testing.T) {
	pods := map[string]any{"items": []any{map[string]any{
		"metadata": map[string]any{"namespace": "tenant-secret-ns", "name": "payroll-7f9"},
		"spec": map[string]any{"containers": []any{
			map[string]any{"name": "main", "image": "registry.example/pay:1", "imagePullPolicy": "Always"},
			map[string]any{"name": "side", "image": "registry.example/pay:1", "imagePullPolicy": "Always"},
			map[string]any{"name": "ok", "image": "registry.example/ok:1", "imagePullPolicy": "IfNotPresent"},
		}}}}}
	var selector string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case clusterVersionPath:
			json.NewEncoder(w).Encode(cvAt("4.20.3"))
		case "/api/v1/pods":
			selector = r.URL.Query().Get("fieldSelector")
			json.NewEncoder(w).Encode(pods)
		default:
			w.WriteHeader(http.StatusNotFound)
			json.NewEncoder(w).Encode(map[string]string{"reason": "NotFound"})
		}
	}))
	defer srv.Close()
	c := &Client{ep: endpoint{server: srv.URL}, tokens: &tokens{}, hc: srv.Client(), log: slog.New(slog.DiscardHandler), Attempts: 1}
	p, err := c.Preflight(t.Context(), "node-a", "4.20.5", nil)
	if err != nil {
		t.Fatal(err)
	}
	if selector != "spec.nodeName=node-a" {
		t.Errorf("pods listed with fieldSelector %q, want spec.nodeName=node-a", selector)
	}
	w := strings.Join(p.Warnings, "\n")
	if !strings.Contains(w, "2 containers") || !strings.Contains(w, "registry.example/pay:1") || strings.Contains(w, "tenant-secret-ns") || strings.Contains(w, "payroll") {
		t.Errorf("warnings %q", w)
	}
	if len(p.Details) != 2 || !strings.Contains(p.Details[0], "tenant-secret-ns/payroll-7f9/") {
		t.Errorf("details %q", p.Details)
	}
}

// TestKeepRecord_RenewsAnUnchangedRecord: with nothing changing, the
// record is written again every leaseRenew, each renewal later.
func TestKeepRecord_RenewsAnUnchangedRecord(t *testing.T) {
	defer func(d time.Duration) { leaseRenew = d }(leaseRenew)
	leaseRenew = 1100 * time.Millisecond
	api := &leaseAPI{t: t, node: "node-a"}
	stop := keepRecord(t, api, "192.0.2.7")
	// Three writes, however slow the machine: then their own stamps say
	// how far apart they were (a timer never fires early).
	deadline := time.Now().Add(30 * time.Second)
	for {
		api.mu.Lock()
		n := len(api.writes)
		api.mu.Unlock()
		if n >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d writes in 30 s renewing every %s, want 3", n, leaseRenew)
		}
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	api.mu.Lock()
	defer api.mu.Unlock()
	for i, l := range api.writes {
		if i > 0 && l.renewed().Sub(api.writes[i-1].renewed()) < leaseRenew-100*time.Millisecond {
			t.Errorf("renewal %d at %s, %s after the last: more often than every %s", i, l.Spec.RenewTime, l.renewed().Sub(api.writes[i-1].renewed()), leaseRenew)
		}
		if l.Metadata.Annotations[AnnotationAddress] != "192.0.2.7" {
			t.Errorf("address %q, want the configured listen IP", l.Metadata.Annotations[AnnotationAddress])
		}
		if i > 0 && !l.renewed().After(api.writes[i-1].renewed()) {
			t.Errorf("renewal %d at %s, not after %s", i, l.Spec.RenewTime, api.writes[i-1].Spec.RenewTime)
		}
	}
}
