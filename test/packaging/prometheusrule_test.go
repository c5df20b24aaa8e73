package packaging

import (
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/ferry-edge/ferry/agent"
)

// ruleSpec is the PrometheusRule's spec, as promtool reads a rules file.
type ruleSpec struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert string `yaml:"alert"`
			Expr  string `yaml:"expr"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// TestPrometheusRule_PromtoolChecksItAndEachAlertFires: the shipped
// PrometheusRule's spec passes promtool check rules; promtool test rules
// (packaging/prometheusrule_test.yaml) passes and shows every alert
// firing at least once; every metric its rules read is one ferry
// exports (metrics/).
func TestPrometheusRule_PromtoolChecksItAndEachAlertFires(t *testing.T) {
	promtool := needTool(t, "promtool", "prometheus")
	var rule struct {
		Kind string         `yaml:"kind"`
		Spec map[string]any `yaml:"spec"`
	}
	if err := yaml.Unmarshal([]byte(repoFile(t, "packaging/prometheusrule.yaml")), &rule); err != nil {
		t.Fatal(err)
	}
	if rule.Kind != "PrometheusRule" {
		t.Fatalf("kind %q", rule.Kind)
	}
	spec, err := yaml.Marshal(rule.Spec)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "ferry-rules.yaml"), spec, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := repoFile(t, "packaging/prometheusrule_test.yaml")
	if err := os.WriteFile(filepath.Join(dir, "rules_test.yaml"), []byte(tests), 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, dir, promtool, "check", "rules", "ferry-rules.yaml")
	run(t, dir, promtool, "test", "rules", "rules_test.yaml")

	var rs ruleSpec
	if err := yaml.Unmarshal(spec, &rs); err != nil {
		t.Fatal(err)
	}
	var cases struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string `yaml:"alertname"`
				ExpAlerts []any  `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	if err := yaml.Unmarshal([]byte(tests), &cases); err != nil {
		t.Fatal(err)
	}
	fires := map[string]bool{}
	for _, tc := range cases.Tests {
		for _, a := range tc.AlertRuleTest {
			fires[a.Alertname] = fires[a.Alertname] || len(a.ExpAlerts) > 0
		}
	}
	exported := exportedMetrics(t)
	name := regexp.MustCompile(`\bferry_[a-z_]+`)
	for _, g := range rs.Groups {
		for _, r := range g.Rules {
			if !fires[r.Alert] {
				t.Errorf("alert %s is never shown firing in packaging/prometheusrule_test.yaml", r.Alert)
			}
			for _, m := range name.FindAllString(r.Expr, -1) {
				if !slices.Contains(exported, m) {
					t.Errorf("alert %s reads %s, which ferry does not export (metrics/)", r.Alert, m)
				}
			}
		}
	}
}

// exportedMetrics are the metric names metrics/ defines.
func exportedMetrics(t *testing.T) []string {
	t.Helper()
	var out []string
	files, _ := filepath.Glob(filepath.Join(root, "metrics", "*.go"))
	re := regexp.MustCompile(`"(ferry_[a-z_]+)"`)
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range re.FindAllStringSubmatch(string(b), -1) {
			out = append(out, m[1])
		}
	}
	if len(out) == 0 {
		t.Fatal("no metric names found in metrics/")
	}
	return out
}

// TestServiceMonitor_ScrapesTheDefaultPeerPortAsOpenShiftsPrometheus: the
// shipped ServiceMonitor moves each kubelet endpoint to the peer port of
// the default config, over TLS with the kubelet serving CA and the
// monitoring's client certificate.
func TestServiceMonitor_ScrapesTheDefaultPeerPortAsOpenShiftsPrometheus(t *testing.T) {
	var sm struct {
		Kind string `yaml:"kind"`
		Spec struct {
			Endpoints []struct {
				Scheme      string `yaml:"scheme"`
				Relabelings []struct {
					TargetLabel string `yaml:"targetLabel"`
					Replacement string `yaml:"replacement"`
				} `yaml:"relabelings"`
				TLSConfig struct {
					CAFile   string `yaml:"caFile"`
					CertFile string `yaml:"certFile"`
				} `yaml:"tlsConfig"`
			} `yaml:"endpoints"`
		} `yaml:"spec"`
	}
	if err := yaml.Unmarshal([]byte(repoFile(t, "packaging/servicemonitor.yaml")), &sm); err != nil {
		t.Fatal(err)
	}
	if sm.Kind != "ServiceMonitor" || len(sm.Spec.Endpoints) != 1 {
		t.Fatalf("%+v", sm)
	}
	_, port, err := net.SplitHostPort(agent.DefaultConfig().Peer.Listen)
	if err != nil {
		t.Fatal(err)
	}
	ep := sm.Spec.Endpoints[0]
	moved := false
	for _, r := range ep.Relabelings {
		moved = moved || r.TargetLabel == "__address__" && r.Replacement == "$1:"+port
	}
	if !moved || ep.Scheme != "https" {
		t.Errorf("the ServiceMonitor does not scrape https on the default peer port %s: %+v", port, ep)
	}
	if !strings.Contains(ep.TLSConfig.CAFile, "kubelet-serving-ca") || !strings.Contains(ep.TLSConfig.CertFile, "metrics-client-certs") {
		t.Errorf("tlsConfig %+v", ep.TLSConfig)
	}
}
