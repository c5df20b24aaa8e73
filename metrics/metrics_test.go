package metrics

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/crio"
	"github.com/ferry-edge/ferry/pull"
)

const dig = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"

func rec(id string, o agent.Origin, p agent.Phase, prog agent.Progress) agent.Record {
	return agent.Record{ID: id, Name: "upgrade-4.13.7-x86_64.tar", Digest: dig, Origin: o, Phase: p, Progress: prog}
}

func status(recs ...agent.Record) agent.Status { return agent.Status{Healthy: true, Bundles: recs} }

// scrape is what Handler serves, as Prometheus reads it.
func scrape(t *testing.T, m *Metrics) string {
	t.Helper()
	w := httptest.NewRecorder()
	m.Handler().ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	if w.Code != http.StatusOK {
		t.Fatalf("/metrics: %d", w.Code)
	}
	return w.Body.String()
}

func wantLines(t *testing.T, body string, lines ...string) {
	t.Helper()
	for _, l := range lines {
		if !strings.Contains(body, "\n"+l+"\n") {
			t.Errorf("no line %q in:\n%s", l, grepFerry(body))
		}
	}
}

func grepFerry(body string) string {
	var out []string
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, "ferry_") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestObserve_PhasesImagesAndTheBytesOfAStick: a stick's bundle read in
// three reports (the last one never published: the job's end is), then
// loaded: the state set follows the phase, the bytes read from the
// stick are the tar's length, the images pinned follow the load; the
// first status (a restarted agent's) counts nothing.
func TestObserve_PhasesImagesAndTheBytesOfAStick(t *testing.T) {
	m := New()
	m.Observe(status(rec("old", agent.OriginFile, agent.PhaseDetected, agent.Progress{Done: 500, Total: 1000, Unit: "bytes"})))
	m.Observe(status(rec("old", agent.OriginFile, agent.PhaseRejected, agent.Progress{Done: 500, Total: 1000, Unit: "bytes"})))
	m.Observe(status(rec("s", agent.OriginStick, agent.PhaseDetected, agent.Progress{Done: 100, Total: 1000, Unit: "bytes"})))
	m.Observe(status(rec("s", agent.OriginStick, agent.PhaseDetected, agent.Progress{Done: 600, Total: 1000, Unit: "bytes"})))
	m.Observe(status(rec("s", agent.OriginStick, agent.PhaseExtracted, agent.Progress{Done: 600, Total: 1000, Unit: "bytes"})))
	if got := testutil.ToFloat64(m.fetched.WithLabelValues(SourceStick)); got != 1000 {
		t.Errorf("bytes read from the stick: %v, want the tar's 1000", got)
	}
	if got := testutil.ToFloat64(m.fetched.WithLabelValues(SourceFile)); got != 0 {
		t.Errorf("bytes of a refused file that were counted before the restart: %v", got)
	}
	m.Observe(status(rec("s", agent.OriginStick, agent.PhaseLoading, agent.Progress{Done: 3, Total: 5, Unit: "images"})))
	body := scrape(t, m)
	wantLines(t, body,
		`ferry_bundle_phase{bundle="upgrade-4.13.7-x86_64.tar",digest="`+dig+`",phase="loading"} 1`,
		`ferry_bundle_phase{bundle="upgrade-4.13.7-x86_64.tar",digest="`+dig+`",phase="extracted"} 0`,
		`ferry_images_expected{bundle="upgrade-4.13.7-x86_64.tar",digest="`+dig+`"} 5`,
		`ferry_images_pinned{bundle="upgrade-4.13.7-x86_64.tar",digest="`+dig+`"} 3`,
		`ferry_node_healthy 1`,
		`ferry_fetched_bytes_total{source="stick"} 1000`)
}

// TestObserve_RefusalsAndFailuresByReason: each record that moves into
// rejected, conflict or failed counts once, by its reason; staying
// there counts nothing more.
func TestObserve_RefusalsAndFailuresByReason(t *testing.T) {
	m := New()
	m.Observe(status())
	bad := rec("b", agent.OriginStick, agent.PhaseRejected, agent.Progress{})
	bad.Condition.Reason = agent.ReasonDigestMismatch
	m.Observe(status(bad))
	m.Observe(status(bad))
	other := rec("c", agent.OriginPeer, agent.PhaseConflict, agent.Progress{})
	other.Digest, other.Condition.Reason = "sha256:bbbb", agent.ReasonBundlesDiffer
	failed := rec("f", agent.OriginPeer, agent.PhaseFailed, agent.Progress{})
	failed.Digest, failed.Condition.Reason = "sha256:cccc", agent.ReasonLoadFailed
	m.Observe(status(bad, other, failed))
	for reason, want := range map[string]float64{agent.ReasonDigestMismatch: 1, agent.ReasonBundlesDiffer: 1} {
		if got := testutil.ToFloat64(m.refusals.WithLabelValues(reason)); got != want {
			t.Errorf("refusals %s: %v, want %v", reason, got, want)
		}
	}
	if got := testutil.ToFloat64(m.failures.WithLabelValues(agent.ReasonLoadFailed)); got != 1 {
		t.Errorf("failures: %v", got)
	}
}

// TestObserve_ARegistryPullsBytesAcrossRuns: registry mode's bytes over
// the link count as they grow, and again from zero when a run starts
// over; bytes served to the nodes following it count as the peers'.
func TestObserve_ARegistryPullsBytesAcrossRuns(t *testing.T) {
	m := New()
	m.Observe(agent.Status{})
	for _, p := range []pull.Status{
		{Release: "r", Bytes: 100, Shared: 10},
		{Release: "r", Bytes: 300, Shared: 30},
		{Release: "r", Bytes: 50}, // the next run
		{Release: "r", Bytes: 70},
	} {
		m.Observe(agent.Status{Pull: &p})
	}
	if got := testutil.ToFloat64(m.fetched.WithLabelValues(SourceRegistry)); got != 370 {
		t.Errorf("bytes from the registry: %v, want 370", got)
	}
	if got := testutil.ToFloat64(m.served.WithLabelValues(SourcePeer)); got != 30 {
		t.Errorf("bytes served to followers: %v, want 30", got)
	}
}

type fakeReloader struct{ err error }

func (f fakeReloader) Reload(context.Context) error { return f.err }

type fakeLoader struct {
	agent.Loader
	missing int
	err     error
}

func (f fakeLoader) Restore(context.Context, *bundle.Metadata, []string, string) (int, error) {
	return f.missing, f.err
}

// TestHooks_ReloadsRecoveriesAndAPIRequests: the wrappers count CRI-O's
// reloads by result, the running release's recoveries and the images
// missing meanwhile, and the API's answers by code.
func TestHooks_ReloadsRecoveriesAndAPIRequests(t *testing.T) {
	m := New()
	ctx := t.Context()
	m.Reloader(fakeReloader{}).Reload(ctx)
	m.Reloader(fakeReloader{errors.New("job failed")}).Reload(ctx)
	m.Reloader(fakeReloader{crio.ErrNotRunning}).Reload(ctx)
	for res, want := range map[string]float64{"ok": 1, "failed": 1, "crio_down": 1} {
		if got := testutil.ToFloat64(m.reloads.WithLabelValues(res)); got != want {
			t.Errorf("reloads %s: %v", res, got)
		}
	}

	m.Loader(fakeLoader{missing: 4, err: errors.New("pull failed")}).Restore(ctx, nil, nil, "")
	if got := testutil.ToFloat64(m.missing); got != 4 {
		t.Errorf("missing after a failed recovery: %v", got)
	}
	m.Loader(fakeLoader{missing: 4}).Restore(ctx, nil, nil, "")
	m.Loader(fakeLoader{}).Restore(ctx, nil, nil, "")
	if got := testutil.ToFloat64(m.missing); got != 0 {
		t.Errorf("missing after the recovery: %v", got)
	}
	if f, r, n := testutil.ToFloat64(m.recoveries.WithLabelValues("failed")), testutil.ToFloat64(m.recoveries.WithLabelValues("restored")), testutil.ToFloat64(m.recovered); f != 1 || r != 1 || n != 4 {
		t.Errorf("recoveries failed %v restored %v images %v", f, r, n)
	}

	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPatch {
			w.WriteHeader(http.StatusForbidden)
		}
	}))
	hc := &http.Client{Transport: m.Transport(http.DefaultTransport)}
	for _, method := range []string{"GET", "PATCH"} {
		req, _ := http.NewRequest(method, srv.URL, nil)
		if resp, err := hc.Do(req); err == nil {
			resp.Body.Close()
		}
	}
	srv.Close()
	hc.Get(srv.URL) // nothing answers
	wantLines(t, scrape(t, m),
		`ferry_api_requests_total{code="200",method="GET"} 1`,
		`ferry_api_requests_total{code="403",method="PATCH"} 1`,
		`ferry_api_requests_total{code="error",method="GET"} 1`)
}
