package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// poolAPI plays the API server for a Follower after an upgrade: its own
// Node, Done on the old rendered config, and the worker pool, paused or
// not; every other collection is empty and watches send nothing.
type poolAPI struct {
	paused       atomic.Bool
	lists, reads atomic.Int32 // of the pools: listed, read by name
}

func (s *poolAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	worker := func() string {
		return fmt.Sprintf(`{"metadata":{"name":"worker"},"spec":{"paused":%v,"nodeSelector":{"matchLabels":{"node-role.kubernetes.io/worker":""}},
			"configuration":{"name":"rendered-worker-2"}},"status":{"machineCount":1}}`, s.paused.Load())
	}
	if r.URL.Query().Get("watch") == "1" {
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		return
	}
	switch r.URL.Path {
	case "/api/v1/nodes":
		fmt.Fprint(w, `{"metadata":{"resourceVersion":"5"},"items":[{"metadata":{"name":"node-a","resourceVersion":"4",
			"labels":{"node-role.kubernetes.io/worker":""},
			"annotations":{"machineconfiguration.openshift.io/state":"Done","machineconfiguration.openshift.io/currentConfig":"rendered-worker-1","machineconfiguration.openshift.io/desiredConfig":"rendered-worker-1"}}}]}`)
	case poolsPath:
		s.lists.Add(1)
		fmt.Fprintf(w, `{"items":[%s]}`, worker())
	case poolsPath + "/worker":
		s.reads.Add(1)
		fmt.Fprint(w, worker())
	default:
		fmt.Fprint(w, `{"metadata":{"resourceVersion":"5"},"items":[]}`)
	}
}

// TestFollower_APausedPoolIsTheReasonAtTheNextReading: the pools were
// listed (for the count of nodes) just before the administrator paused
// the worker pool; the next reading of this node's machine config state
// says the pool is paused, not the pool as listed before.
func TestFollower_APausedPoolIsTheReasonAtTheNextReading(t *testing.T) {
	api := &poolAPI{}
	f, ctx := followPools(t, api)
	if n, known, err := f.MachineCount(ctx); n != 1 || !known || err != nil {
		t.Fatalf("MachineCount %d %v %v", n, known, err)
	}
	api.paused.Store(true)
	st, err := f.MachineConfigState(ctx, "node-a")
	if err != nil || !st.Managed || st.Pool != "worker" || !st.Paused {
		t.Fatalf("right after the pause: %+v, %v; want pool worker paused", st, err)
	}
}

// TestFollower_ReadsItsOnePoolByName: the pools are listed once, to find
// which is this node's; every later reading of its machine config state
// reads that one pool by name (its size does not grow with the pools),
// and the count of nodes is listed again only after poolsFor.
func TestFollower_ReadsItsOnePoolByName(t *testing.T) {
	api := &poolAPI{}
	f, ctx := followPools(t, api)
	for i := range 5 {
		st, err := f.MachineConfigState(ctx, "node-a")
		if err != nil || st.Pool != "worker" || st.Target != "rendered-worker-2" {
			t.Fatalf("reading %d: %+v, %v", i, st, err)
		}
		if i == 2 {
			api.paused.Store(true)
		}
		if i > 2 && !st.Paused {
			t.Fatalf("reading %d after the pause: %+v", i, st)
		}
	}
	for range 3 {
		if n, known, err := f.MachineCount(ctx); n != 1 || !known || err != nil {
			t.Fatalf("MachineCount %d %v %v", n, known, err)
		}
	}
	if l, r := api.lists.Load(), api.reads.Load(); l != 1 || r != 4 {
		t.Fatalf("pools listed %d times, read by name %d; want listed once (then counted from that list), read by name 4 times", l, r)
	}
}

// TestFollower_NodeChangesAreTheMCOsNotFerrys: the signal that has the
// agent read its machine config state again fires at a change of the
// MCO's annotations or of a label a pool may select on, not at ferry's
// own writes to its Node (its phase label and annotations, many a flow).
func TestFollower_NodeChangesAreTheMCOsNotFerrys(t *testing.T) {
	var changed, mco Signal
	i := (&Client{}).Inform("/api/v1/nodes", "metadata.name=node-a", &changed).Also(&mco, mcoKey)
	i.objs = map[string]json.RawMessage{}
	node := func(rv int, state, phase string, labels string) Event {
		return Event{Type: "MODIFIED", Object: json.RawMessage(fmt.Sprintf(`{"metadata":{"name":"node-a","resourceVersion":"%d",
			"labels":{"ferry.io/phase":%q%s},
			"annotations":{"ferry.io/phase":%q,"machineconfiguration.openshift.io/state":%q}}}`, rv, phase, labels, phase, state))}
	}
	fired := func(c <-chan struct{}) bool {
		select {
		case <-c:
			return true
		default:
			return false
		}
	}
	step := func(ev Event, wantMCO bool) {
		t.Helper()
		c, m := changed.C(), mco.C()
		if _, err := i.apply(ev, ""); err != nil {
			t.Fatal(err)
		}
		if !fired(c) {
			t.Fatal("a change of the Node is no change to the follower")
		}
		if fired(m) != wantMCO {
			t.Fatalf("the MCO's signal fired %v, want %v", !wantMCO, wantMCO)
		}
	}
	step(node(1, "Done", "idle", ""), true)
	step(node(2, "Done", "loading", ""), false)
	step(node(3, "Done", "loaded", ""), false)
	step(node(4, "Working", "loaded", ""), true)
	step(node(5, "Working", "loaded", `,"node-role.kubernetes.io/infra":""`), true)
}

// followPools runs node-a's follower against api until the test ends,
// and returns once it has read its Node.
func followPools(t *testing.T, api *poolAPI) (*Follower, context.Context) {
	t.Helper()
	srv := httptest.NewTLSServer(api)
	t.Cleanup(srv.Close)
	c := &Client{ep: endpoint{server: srv.URL}, tokens: &tokens{}, hc: srv.Client(), stream: srv.Client(), log: slog.New(slog.DiscardHandler), Attempts: 1}
	f := c.Follow("node-a")
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() { f.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, found, synced := f.nodes.Get("node-a"); found && synced {
			return f, ctx
		}
		if time.Now().After(deadline) {
			t.Fatal("the follower never read its Node")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
