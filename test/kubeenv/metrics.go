package kubeenv

import (
	"bufio"
	"crypto/tls"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Requests is the API server's own count of the requests it answered
// (apiserver_request_total from /metrics), by "VERB resource[/subresource]".
// The metric has no user label: compare two readings over a window.
func (e *Env) Requests() map[string]float64 {
	e.t.Helper()
	req, err := http.NewRequest("GET", e.Server+"/metrics", nil)
	must(e.t, err)
	req.Header.Set("Authorization", "Bearer admintoken")
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := hc.Do(req)
	must(e.t, err)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		e.t.Fatalf("GET /metrics: %s", resp.Status)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "apiserver_request_total{")
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(line, "} ")
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
		key := l["verb"] + " " + l["resource"]
		if l["subresource"] != "" {
			key += "/" + l["subresource"]
		}
		out[key] += v
	}
	must(e.t, sc.Err())
	return out
}
