package metrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferry-edge/ferry/agent"
)

// What the agent's status says, as metrics: Observe receives every
// status the agent publishes (agent.Deps.Published); the gauges are
// read from the newest at each scrape, and the counters that follow
// from one status to the next (a refusal, bytes read from a stick, a
// registry pull's bytes) are counted as they are seen.

// phases are the phases a bundle's state set shows, in order.
var phases = []agent.Phase{
	agent.PhaseDetected, agent.PhaseFetching, agent.PhaseExtracted, agent.PhaseLoading, agent.PhaseLoaded,
	agent.PhaseClusterReady, agent.PhaseUpgrading, agent.PhaseUpgraded, agent.PhaseCleaned,
	agent.PhaseRejected, agent.PhaseFailed, agent.PhaseConflict,
}

var (
	phaseDesc = prometheus.NewDesc("ferry_bundle_phase",
		"1 for the phase each bundle this node holds a record of is in, 0 for the others (a state set).",
		[]string{"bundle", "digest", "phase"}, nil)
	expectedDesc = prometheus.NewDesc("ferry_images_expected",
		"Images a bundle's load pulls and pins on this node.", []string{"bundle", "digest"}, nil)
	pinnedDesc = prometheus.NewDesc("ferry_images_pinned",
		"Images of a bundle pulled and pinned on this node so far (its load's progress).", []string{"bundle", "digest"}, nil)
	healthyDesc = prometheus.NewDesc("ferry_node_healthy",
		"1 when the node's status is healthy (ferry status), 0 when a refusal, failure or setup fault needs a person.", nil, nil)
)

// statusCollector serves the gauges of the newest status observed.
type statusCollector struct {
	mu   sync.Mutex
	last *agent.Status
	seen seen
}

// seen is what the counters were at in the previous status.
type seen struct {
	primed bool
	phase  map[string]agent.Phase // by record ID
	read   map[string]int64       // bytes read of a record still detected, by ID
	total  map[string]int64       // the length being read, by ID
	pull   struct {
		release       string
		bytes, shared int64
	}
}

// Observe takes one status the agent published.
func (m *Metrics) Observe(s agent.Status) {
	if m == nil {
		return
	}
	c := m.status
	c.mu.Lock()
	defer c.mu.Unlock()
	c.last = &s
	c.count(m, s)
}

// count counts what changed since the previous status. The first
// status only primes: what a restarted agent holds was counted before.
func (c *statusCollector) count(m *Metrics, s agent.Status) {
	old := c.seen
	next := seen{primed: true, phase: map[string]agent.Phase{}, read: map[string]int64{}, total: map[string]int64{}}
	next.pull = old.pull
	for _, r := range s.Bundles {
		next.phase[r.ID] = r.Phase
		was, known := old.phase[r.ID]
		moved := old.primed && (!known || was != r.Phase)
		if moved {
			switch r.Phase {
			case agent.PhaseRejected, agent.PhaseConflict:
				m.refusals.WithLabelValues(r.Condition.Reason).Inc()
			case agent.PhaseFailed:
				m.failures.WithLabelValues(r.Condition.Reason).Inc()
			}
		}
		src := readSource(r.Origin)
		if src == "" {
			continue
		}
		switch {
		case r.Phase == agent.PhaseDetected && r.Progress.Unit == "bytes":
			next.read[r.ID], next.total[r.ID] = r.Progress.Done, r.Progress.Total
			if !old.primed {
				continue
			}
			prev := old.read[r.ID]
			if r.Progress.Done < prev { // read again from the start
				prev = 0
			}
			m.Fetched(src, r.Progress.Done-prev)
		case was == agent.PhaseDetected && moved && r.Phase != agent.PhaseRejected && r.Phase != agent.PhaseFailed:
			// Read to its end: the last progress report may not have
			// been published before the job's end was.
			m.Fetched(src, old.total[r.ID]-old.read[r.ID])
		}
	}
	if p := s.Pull; p != nil {
		prev := old.pull
		if p.Release != prev.release || p.Bytes < prev.bytes || p.Shared < prev.shared { // another pull, or another run of it
			prev.bytes, prev.shared = 0, 0
		}
		if old.primed {
			m.Fetched(SourceRegistry, p.Bytes-prev.bytes)
			m.Served(SourcePeer, p.Shared-prev.shared)
		}
		next.pull.release, next.pull.bytes, next.pull.shared = p.Release, p.Bytes, p.Shared
	}
	c.seen = next
}

// readSource is the source label of the bytes a bundle of origin o is
// read from on this node; "" for a peer's (counted as they arrive).
func readSource(o agent.Origin) string {
	switch o {
	case agent.OriginStick:
		return SourceStick
	case agent.OriginFile:
		return SourceFile
	}
	return ""
}

func (c *statusCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- phaseDesc
	ch <- expectedDesc
	ch <- pinnedDesc
	ch <- healthyDesc
}

func (c *statusCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	s := c.last
	c.mu.Unlock()
	if s == nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(healthyDesc, prometheus.GaugeValue, boolValue(s.Healthy))
	for _, r := range shownRecords(s.Bundles) {
		d := string(r.Digest)
		for _, p := range phases {
			ch <- prometheus.MustNewConstMetric(phaseDesc, prometheus.GaugeValue, boolValue(r.Phase == p), r.Name, d, string(p))
		}
		if r.Progress.Unit == "images" {
			pinned := r.Progress.Done
			if r.Phase.Loaded() || r.Phase == agent.PhaseUpgraded {
				// Loaded: the loader checked every image pinned (the
				// load's last progress report may not have been shown).
				pinned = r.Progress.Total
			}
			ch <- prometheus.MustNewConstMetric(expectedDesc, prometheus.GaugeValue, float64(r.Progress.Total), r.Name, d)
			ch <- prometheus.MustNewConstMetric(pinnedDesc, prometheus.GaugeValue, float64(pinned), r.Name, d)
		}
	}
}

// shownRecords is one record per bundle (name and digest), in order: of
// two records of one bundle (a refused copy beside the one held), the
// active one.
func shownRecords(recs []agent.Record) []agent.Record {
	at := map[[2]string]int{}
	var out []agent.Record
	for _, r := range recs {
		k := [2]string{r.Name, string(r.Digest)}
		i, dup := at[k]
		switch {
		case !dup:
			at[k] = len(out)
			out = append(out, r)
		case r.Phase.Active() && !out[i].Phase.Active():
			out[i] = r
		}
	}
	return out
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
