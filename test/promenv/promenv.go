// Package promenv runs a real Prometheus for tests: Debian's prometheus
// binary, run by hand with a scratch config and storage (no systemd),
// scraping the targets a test gives it, and asked through its HTTP API as
// a dashboard or an alert would ask it. With CI=true a missing binary
// fails the test, elsewhere it skips it.
package promenv

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/ferry-edge/ferry/test/crioenv"
	"github.com/ferry-edge/ferry/test/freeport"
)

// Prometheus is a running Prometheus.
type Prometheus struct {
	t   testing.TB
	URL string // http://127.0.0.1:port
	Dir string
	cmd *exec.Cmd
}

// Job is one scrape job: its targets (host:port) over HTTPS with the
// client certificate and the CA to check the targets with, every
// Interval, each target labelled as Labels says (by target).
type Job struct {
	Name     string
	Targets  []string
	Labels   map[string]map[string]string
	CAFile   string
	CertFile string
	KeyFile  string
	Interval time.Duration
}

// Start starts Prometheus scraping job and waits until it is ready.
func Start(t testing.TB, job Job) *Prometheus {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	crioenv.Need(t, err == nil, "no prometheus binary: apt-get install prometheus (test/setup/install-deps.sh)")
	dir := t.TempDir()
	var statics []map[string]any
	for _, tg := range job.Targets {
		statics = append(statics, map[string]any{"targets": []string{tg}, "labels": job.Labels[tg]})
	}
	iv := job.Interval.String()
	cfg := map[string]any{
		"global": map[string]any{"scrape_interval": iv, "scrape_timeout": iv},
		"scrape_configs": []any{map[string]any{
			"job_name": job.Name, "scheme": "https", "static_configs": statics,
			"tls_config": map[string]any{"ca_file": job.CAFile, "cert_file": job.CertFile, "key_file": job.KeyFile},
		}},
	}
	b, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, b, 0o644); err != nil {
		t.Fatal(err)
	}
	addr := freeport.Addr(t)
	log, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &Prometheus{t: t, URL: "http://" + addr, Dir: dir, cmd: cmd}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			out, _ := os.ReadFile(filepath.Join(dir, "prometheus.log"))
			t.Logf("prometheus's log:\n%s", out)
		}
	})
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := http.Get(p.URL + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus not ready after a minute: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Sample is one series of an instant query's answer.
type Sample struct {
	Labels map[string]string
	Value  float64
}

// Query asks an instant query (at now).
func (p *Prometheus) Query(ctx context.Context, q string) ([]Sample, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", p.URL+"/api/v1/query?query="+url.QueryEscape(q), nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var ans struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []struct {
				Metric map[string]string `json:"metric"`
				Value  [2]any            `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&ans); err != nil {
		return nil, err
	}
	if ans.Status != "success" {
		return nil, fmt.Errorf("query %s: %s", q, ans.Error)
	}
	var out []Sample
	for _, r := range ans.Data.Result {
		s, _ := r.Value[1].(string)
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return nil, fmt.Errorf("query %s: value %v", q, r.Value)
		}
		out = append(out, Sample{Labels: r.Metric, Value: v})
	}
	return out, nil
}

// WaitFor asks q until it answers at least one series, failing after
// timeout; the answer.
func (p *Prometheus) WaitFor(timeout time.Duration, what, q string) []Sample {
	p.t.Helper()
	deadline := time.Now().Add(timeout)
	var last error
	for {
		got, err := p.Query(context.Background(), q)
		if err == nil && len(got) > 0 {
			return got
		}
		last = err
		if time.Now().After(deadline) {
			p.t.Fatalf("timed out after %s waiting for %s (%s): %v", timeout, what, q, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
