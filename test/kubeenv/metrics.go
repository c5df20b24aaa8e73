package kubeenv

import (
	"bufio"
	"crypto/tls"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Requests is the API server's own count of the requests it answered
// (apiserver_request_total from /metrics), by "VERB resource[/subresource]".
// The metric has no user label: compare two readings over a window.
func (e *Env) Requests() map[string]float64 {
	e.t.Helper()
	out := map[string]float64{}
	for _, s := range e.Metrics("apiserver_request_total") {
		key := s.Labels["verb"] + " " + s.Labels["resource"]
		if s.Labels["subresource"] != "" {
			key += "/" + s.Labels["subresource"]
		}
		out[key] += s.Value
	}
	return out
}

// Sample is one series of the API server's /metrics at one reading.
type Sample struct {
	Name   string // e.g. apiserver_watch_events_sizes_sum
	Labels map[string]string
	Value  float64
}

// Metrics reads the API server's own /metrics: every series whose name
// is one of names (a histogram's as NAME_sum, NAME_count, NAME_bucket).
func (e *Env) Metrics(names ...string) []Sample {
	e.t.Helper()
	req, err := http.NewRequest("GET", e.Server+"/metrics", nil)
	must(e.t, err)
	req.Header.Set("Authorization", "Bearer admintoken")
	// Generous: a benchmark reads it from a server it keeps busy.
	hc := &http.Client{Timeout: 3 * time.Minute, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := hc.Do(req)
	must(e.t, err)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		e.t.Fatalf("GET /metrics: %s", resp.Status)
	}
	var out []Sample
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), "{")
		if !ok || !slices.Contains(names, name) {
			continue
		}
		labels, value, ok := strings.Cut(rest, "} ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			continue
		}
		l := map[string]string{}
		for _, kv := range strings.Split(labels, ",") {
			k, v, _ := strings.Cut(kv, "=")
			l[k] = strings.Trim(v, `"`)
		}
		out = append(out, Sample{Name: name, Labels: l, Value: v})
	}
	must(e.t, sc.Err())
	return out
}

// Delta is what each series of b grew since a (Requests read twice):
// series that did not grow are left out.
func Delta(a, b map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range b {
		if d := v - a[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

// Sum is the total of every series of m.
func Sum(m map[string]float64) float64 {
	s := 0.0
	for _, v := range m {
		s += v
	}
	return s
}
