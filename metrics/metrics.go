// Package metrics owns ferry's Prometheus metrics: one registry per
// agent, fed by the agent's published status (Observe, status.go) and by
// counters at the few places where bytes move (the peers, the embedded
// registry), CRI-O is reloaded, the running release is recovered and the
// API is called. Handler serves them; cmd/ferry mounts it on the peer
// port (peer.ServerOptions.Metrics), behind the peers' checks.
package metrics

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ferry-edge/ferry/crio"
)

// Source kinds, the values of the source label of fetched bytes and the
// kind label of served ones.
const (
	SourceStick    = "stick"    // read from a stick (or a raw device)
	SourceFile     = "file"     // read from a file given to ferry load
	SourcePeer     = "peer"     // fetched from, or served to, the peers
	SourceRegistry = "registry" // fetched from the site's registry (registry mode), or served by the embedded registry to CRI-O
)

// Metrics is one agent's metrics. Its methods are safe for concurrent
// use; a nil *Metrics counts nothing.
type Metrics struct {
	reg        *prometheus.Registry
	fetched    *prometheus.CounterVec
	served     *prometheus.CounterVec
	reloads    *prometheus.CounterVec
	recoveries *prometheus.CounterVec
	recovered  prometheus.Counter
	missing    prometheus.Gauge
	refusals   *prometheus.CounterVec
	failures   *prometheus.CounterVec
	api        *prometheus.CounterVec
	status     *statusCollector
}

// New makes the metrics and their registry (with the process's and Go's
// own collectors).
func New() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		fetched: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_fetched_bytes_total",
			Help: "Bundle bytes this node read, by source: stick, file (ferry load), peer (over the network from other nodes), registry (registry mode, from the site's registry)."}, []string{"source"}),
		served: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_served_bytes_total",
			Help: "Bytes this node served, by kind: peer (bundle bytes to other nodes, and a registry pull to the nodes following it), registry (the embedded registry to CRI-O)."}, []string{"kind"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_crio_reloads_total",
			Help: "CRI-O reloads ferry asked for after changing its drop-ins, by result (ok, failed)."}, []string{"result"}),
		recoveries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_recoveries_total",
			Help: "Checks that found CRI-O lacking images of the running release, by result: restored (loaded and pinned again from the kept tree) or failed (retried)."}, []string{"result"}),
		recovered: prometheus.NewCounter(prometheus.CounterOpts{Name: "ferry_recovered_images_total",
			Help: "Images of the running release loaded and pinned again after CRI-O lost them."}),
		missing: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ferry_images_missing",
			Help: "Images of the running release CRI-O lacked at ferry's last check (at start, at each CRI-O restart, every retention.check_minutes) and that are not loaded again yet."}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_refusals_total",
			Help: "Bundles refused (rejected) or in conflict, by reason (DigestMismatch, NotApproved, BundlesDiffer, ...)."}, []string{"reason"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_failures_total",
			Help: "Bundles whose fetch or load failed, by reason (FetchFailed, LoadFailed, ...)."}, []string{"reason"}),
		api: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_api_requests_total",
			Help: "Requests to the cluster's API server, by method and code (the HTTP status, or \"error\" when no answer came)."}, []string{"method", "code"}),
		status: &statusCollector{},
	}
	m.reg.MustRegister(m.fetched, m.served, m.reloads, m.recoveries, m.recovered, m.missing, m.refusals, m.failures, m.api, m.status,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Handler serves the metrics in Prometheus' text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// Registry is the metrics' registry (tests gather from it).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Fetched counts n bundle bytes read from source.
func (m *Metrics) Fetched(source string, n int64) {
	if m != nil && n > 0 {
		m.fetched.WithLabelValues(source).Add(float64(n))
	}
}

// Served counts n bytes served as kind.
func (m *Metrics) Served(kind string, n int64) {
	if m != nil && n > 0 {
		m.served.WithLabelValues(kind).Add(float64(n))
	}
}

// FetchedFrom is Fetched for one source, as the hooks take it.
func (m *Metrics) FetchedFrom(source string) func(n int64) {
	return func(n int64) { m.Fetched(source, n) }
}

// ServedAs is Served for one kind, as the hooks take it.
func (m *Metrics) ServedAs(kind string) func(n int64) {
	return func(n int64) { m.Served(kind, n) }
}

// Reloaded counts one reload of CRI-O and its result: ok, failed, or
// crio_down (no CRI-O to reload: the loader waits for it).
func (m *Metrics) Reloaded(err error) {
	if m == nil {
		return
	}
	r := "ok"
	switch {
	case errors.Is(err, crio.ErrNotRunning):
		r = "crio_down"
	case err != nil:
		r = "failed"
	}
	m.reloads.WithLabelValues(r).Inc()
}

// Checked records a check of the running release in CRI-O: missing
// images lacked, loaded again unless err.
func (m *Metrics) Checked(missing int, err error) {
	if m == nil {
		return
	}
	switch {
	case err != nil:
		m.recoveries.WithLabelValues("failed").Inc()
		if missing > 0 { // 0: CRI-O did not answer, nothing new is known
			m.missing.Set(float64(missing))
		}
	case missing > 0:
		m.recoveries.WithLabelValues("restored").Inc()
		m.recovered.Add(float64(missing))
		m.missing.Set(0)
	default:
		m.missing.Set(0)
	}
}

// apiRequest counts one request to the API server.
func (m *Metrics) apiRequest(method string, code int) {
	if m == nil {
		return
	}
	c := "error"
	if code > 0 {
		c = strconv.Itoa(code)
	}
	m.api.WithLabelValues(method, c).Inc()
}
