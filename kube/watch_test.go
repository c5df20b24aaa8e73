package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// scriptedAPI answers lists and watches of one collection from a script,
// one step per request, and records what was asked.
type scriptedAPI struct {
	t     *testing.T
	mu    sync.Mutex
	steps []func(w http.ResponseWriter, r *http.Request)
	asked []string // "list", "list rv=0" or "watch rv=N", with the time
	at    []time.Time
}

func (s *scriptedAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if q.Get("fieldSelector") != "metadata.name=version" {
		s.t.Errorf("%s: fieldSelector %q", r.URL, q.Get("fieldSelector"))
	}
	what := "list"
	if rv := q.Get("resourceVersion"); rv != "" {
		what += " rv=" + rv
	}
	if q.Get("watch") == "1" {
		what = "watch rv=" + q.Get("resourceVersion")
		if q.Get("allowWatchBookmarks") != "true" || q.Get("timeoutSeconds") == "" {
			s.t.Errorf("watch %s: no bookmarks or no timeout", r.URL)
		}
	}
	s.mu.Lock()
	s.asked = append(s.asked, what)
	s.at = append(s.at, time.Now())
	var step func(http.ResponseWriter, *http.Request)
	if len(s.steps) > 0 {
		step, s.steps = s.steps[0], s.steps[1:]
	}
	s.mu.Unlock()
	if step == nil {
		<-r.Context().Done() // nothing more: a watch that stays open
		return
	}
	step(w, r)
}

func (s *scriptedAPI) requests() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.asked)
}

func obj(name, rv, note string) string {
	return fmt.Sprintf(`{"metadata":{"name":%q,"resourceVersion":%q},"note":%q}`, name, rv, note)
}

func list(rv string, items ...string) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, `{"metadata":{"resourceVersion":%q},"items":[%s]}`, rv, strings.Join(items, ","))
	}
}

func events(evs ...string) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, _ *http.Request) {
		for _, e := range evs {
			fmt.Fprintln(w, e)
			w.(http.Flusher).Flush()
		}
	}
}

func ev(typ, object string) string { return fmt.Sprintf(`{"type":%q,"object":%s}`, typ, object) }

// TestInformer_ListsWatchesFromTheListAndListsAgainWhenGone: the informer
// lists once and watches from the list's resourceVersion; a watch the
// server ends is taken up from the newest resourceVersion seen (a
// bookmark's too); an ERROR 410 lists again; a 429 waits as long as its
// Retry-After asks. Every change fires the signal; a bookmark does not.
func TestInformer_ListsWatchesFromTheListAndListsAgainWhenGone(t *testing.T) {
	defer func(d time.Duration) { backoffFirst = d }(backoffFirst)
	backoffFirst = 10 * time.Millisecond
	api := &scriptedAPI{t: t}
	api.steps = []func(http.ResponseWriter, *http.Request){
		list("10", obj("a", "9", "")),
		events(ev("ADDED", obj("b", "11", "")), ev("BOOKMARK", `{"metadata":{"resourceVersion":"12"}}`)),
		events(ev("ERROR", `{"kind":"Status","code":410,"reason":"Expired","message":"too old resource version: 12 (15)"}`)),
		list("20", obj("b", "11", ""), obj("c", "19", "")),
		func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			fmt.Fprint(w, `{"kind":"Status","code":429,"reason":"TooManyRequests","message":"slow down"}`)
		},
		events(ev("MODIFIED", obj("c", "21", "changed")), ev("DELETED", obj("b", "22", ""))),
	}
	srv := httptest.NewTLSServer(api)
	defer srv.Close()
	c := &Client{ep: endpoint{server: srv.URL}, tokens: &tokens{}, hc: srv.Client(), stream: srv.Client(), log: slog.New(slog.DiscardHandler), Attempts: 1}

	var changed Signal
	inf := c.Inform("/apis/config.openshift.io/v1/clusterversions", "metadata.name=version", &changed)
	if _, _, synced := inf.Get("a"); synced {
		t.Fatal("synced before it ran")
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); inf.Run(ctx) }()
	defer func() { cancel(); <-done }()

	deadline := time.Now().Add(10 * time.Second)
	for {
		wake := changed.C()
		raw, found, synced := inf.Get("c")
		_, bFound, _ := inf.Get("b")
		if synced && found && strings.Contains(string(raw), "changed") && !bFound {
			break
		}
		select {
		case <-wake:
		case <-time.After(time.Until(deadline)):
			t.Fatalf("the copy never became c changed, b gone; asked %q", api.requests())
		}
	}
	// The first list comes from the watch cache (rv=0); the one after
	// the 410 from etcd, so the copy never goes back in time.
	want := []string{"list rv=0", "watch rv=10", "watch rv=12", "list", "watch rv=20", "watch rv=20"}
	if got := api.requests(); !slices.Equal(got[:min(len(got), len(want))], want) {
		t.Fatalf("asked %q, want %q", got, want)
	}
	api.mu.Lock()
	gap := api.at[5].Sub(api.at[4])
	api.mu.Unlock()
	if gap < time.Second {
		t.Errorf("watched again %s after a 429 with Retry-After: 1", gap)
	}
	objs, _ := inf.List()
	var names []string
	for _, o := range objs {
		var m meta
		json.Unmarshal(o, &m)
		names = append(names, m.Metadata.Name)
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"c"}) {
		t.Errorf("copy holds %v, want [c]", names)
	}
}
