package clusterbench

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ferry-edge/ferry/test/kubeenv"
)

// reading is the API server's own account of its work at one moment,
// from its /metrics: counters by what they count.
type reading struct {
	at       time.Time
	requests map[string]float64 // apiserver_request_total by "VERB resource[/sub]"
	// apiserver_response_sizes_sum, the same keys: the server measures
	// the responses of reads only (GET, LIST, WATCH), not of writes.
	respBytes map[string]float64
	events    map[string]float64 // apiserver_watch_events_total by resource
	evBytes   map[string]float64 // apiserver_watch_events_sizes_sum by resource
	// flows is apiserver_flowcontrol_dispatched_requests_total by flow
	// schema: the nodes' requests (system-nodes, system-node-high) apart
	// from the administrator's and the harness's (exempt).
	flows map[string]float64
}

func read(e *kubeenv.Env) reading {
	r := reading{at: time.Now(), requests: map[string]float64{}, respBytes: map[string]float64{},
		events: map[string]float64{}, evBytes: map[string]float64{}, flows: map[string]float64{}}
	for _, s := range e.Metrics("apiserver_request_total", "apiserver_response_sizes_sum", "apiserver_watch_events_total",
		"apiserver_watch_events_sizes_sum", "apiserver_flowcontrol_dispatched_requests_total") {
		key := s.Labels["verb"] + " " + s.Labels["resource"]
		if s.Labels["subresource"] != "" {
			key += "/" + s.Labels["subresource"]
		}
		kind := s.Labels["resource"] // the watch metrics' resource: nodes, leases.coordination.k8s.io
		if g := s.Labels["group"]; g != "" {
			kind += "." + g
		}
		switch s.Name {
		case "apiserver_request_total":
			r.requests[key] += s.Value
		case "apiserver_response_sizes_sum":
			r.respBytes[key] += s.Value
		case "apiserver_watch_events_total":
			r.events[kind] += s.Value
		case "apiserver_watch_events_sizes_sum":
			r.evBytes[kind] += s.Value
		case "apiserver_flowcontrol_dispatched_requests_total":
			r.flows[s.Labels["flow_schema"]] += s.Value
		}
	}
	return r
}

// window is what the server did between two readings.
type window struct {
	d                                           time.Duration
	requests, respBytes, events, evBytes, flows map[string]float64
}

func between(a, b reading) window {
	return window{d: b.at.Sub(a.at), requests: kubeenv.Delta(a.requests, b.requests), respBytes: kubeenv.Delta(a.respBytes, b.respBytes),
		events: kubeenv.Delta(a.events, b.events), evBytes: kubeenv.Delta(a.evBytes, b.evBytes), flows: kubeenv.Delta(a.flows, b.flows)}
}

// nodes is what the nodes' credentials asked (their flow schemas).
func (w window) nodes() float64 {
	s := 0.0
	for k, v := range w.flows {
		if strings.HasPrefix(k, "system-node") {
			s += v
		}
	}
	return s
}

// less is w less the server's own work at rest (alone, over its own
// window) scaled to w's length.
func (w window) less(alone window) window {
	f := float64(w.d) / float64(alone.d)
	sub := func(a, b map[string]float64) map[string]float64 {
		out := map[string]float64{}
		for k, v := range a {
			if d := v - b[k]*f; d > 0 {
				out[k] = d
			}
		}
		return out
	}
	return window{d: w.d, requests: sub(w.requests, alone.requests), respBytes: sub(w.respBytes, alone.respBytes),
		events: sub(w.events, alone.events), evBytes: sub(w.evBytes, alone.evBytes), flows: sub(w.flows, alone.flows)}
}

// lessHarness is w less the harness's own reads (count and bytes by
// key).
func (w window) lessHarness(reads map[string][2]float64) window {
	for k, r := range reads {
		w.requests[k] = max(w.requests[k]-r[0], 0)
		w.respBytes[k] = max(w.respBytes[k]-r[1], 0)
	}
	return w
}

// top is m's largest entries, "key=value" (value formatted by f).
func top(m map[string]float64, n int, f func(float64) string) string {
	keys := slices.Collect(maps.Keys(m))
	slices.SortFunc(keys, func(a, b string) int {
		if m[a] != m[b] {
			if m[a] > m[b] {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	var parts []string
	for i, k := range keys {
		if i == n {
			parts = append(parts, fmt.Sprintf("(%d more)", len(keys)-n))
			break
		}
		parts = append(parts, k+"="+f(m[k]))
	}
	return strings.Join(parts, " ")
}

func count(v float64) string { return strconv.FormatFloat(v, 'f', 0, 64) }
func kb(v float64) string    { return strconv.FormatFloat(v/1000, 'f', 1, 64) + "kB" }

// cpuSeconds is a process's user+system CPU time so far (0 when gone).
func cpuSeconds(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the command's closing parenthesis: utime and stime
	// are the 12th and 13th.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseFloat(f[11], 64)
	s, _ := strconv.ParseFloat(f[12], 64)
	return (u + s) / 100 // USER_HZ
}

// rssMiB is a process's resident memory.
func rssMiB(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 64)
			return kb / 1024
		}
	}
	return 0
}

// pidOf is the process whose command line holds every one of words.
func pidOf(words ...string) int {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		cmd := string(bytes.ReplaceAll(b, []byte{0}, []byte{' '}))
		ok := true
		for _, w := range words {
			ok = ok && strings.Contains(cmd, w)
		}
		if ok {
			return pid
		}
	}
	return 0
}

// readBytes is the response bytes of GETs and LISTs. A WATCH's response
// size is recorded when the watch ends, and is the sum of the events it
// sent: bytes the watch-event column counted as they were sent, perhaps
// minutes before, so they are left out here and shown apart (watchEnded).
func (w window) readBytes() float64 {
	s := 0.0
	for k, v := range w.respBytes {
		if !strings.HasPrefix(k, "WATCH ") {
			s += v
		}
	}
	return s
}

// watchEnded is the response bytes of the watches that ended in w.
func (w window) watchEnded() float64 { return kubeenv.Sum(w.respBytes) - w.readBytes() }
