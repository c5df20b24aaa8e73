package packaging

import (
	"bytes"
	"encoding/base64"
	"flag"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/kube"
)

var update = flag.Bool("update", false, "rewrite packaging/machineconfig/*.bu and *.yaml from their sources")

// The MachineConfig examples are generated from three sources, so they
// cannot drift from what the RPM ships:
//
//	packaging/ferry.service                     the unit, unchanged
//	packaging/ferry.slice                       its slice, unchanged
//	packaging/machineconfig/10-local-binary.conf  a drop-in running /usr/local/bin/ferry
//	packaging/machineconfig/config.toml         the pool's /etc/ferry/config.toml
const (
	mcDir      = "packaging/machineconfig"
	dropInName = "10-local-binary.conf"
	// kubeconfigPath is where the pool's nodes get ferry's kubeconfig.
	kubeconfigPath = "/etc/ferry/kubeconfig"
	// tokenPath is where the pool's nodes get the peers' shared token.
	tokenPath   = "/etc/ferry/peer-token"
	ignitionVer = "3.4.0"  // what Butane's openshift 4.14.0 variant emits
	butaneVer   = "4.14.0" // oldest OpenShift with Ignition 3.4
	roleLabel   = "machineconfiguration.openshift.io/role"
)

var roles = []string{"worker", "master"}

type mcFile struct {
	Path      string     `yaml:"path"`
	Mode      int        `yaml:"mode"`
	Overwrite bool       `yaml:"overwrite"`
	Contents  mcContents `yaml:"contents"`
}

type mcContents struct {
	Source string `yaml:"source,omitempty"` // MachineConfig: a data URL
	Inline string `yaml:"inline,omitempty"` // Butane
}

type mcDropIn struct {
	Name     string `yaml:"name"`
	Contents string `yaml:"contents"`
}

type mcUnit struct {
	Name     string     `yaml:"name"`
	Enabled  bool       `yaml:"enabled,omitempty"`
	Contents string     `yaml:"contents"`
	DropIns  []mcDropIn `yaml:"dropins,omitempty"`
}

type mcMetadata struct {
	Name   string            `yaml:"name"`
	Labels map[string]string `yaml:"labels"`
}

type ignitionConfig struct {
	Ignition *struct {
		Version string `yaml:"version"`
	} `yaml:"ignition,omitempty"`
	Storage struct {
		Files []mcFile `yaml:"files"`
	} `yaml:"storage"`
	Systemd struct {
		Units []mcUnit `yaml:"units"`
	} `yaml:"systemd"`
}

// butaneDoc is a Butane config (variant openshift).
type butaneDoc struct {
	Variant        string     `yaml:"variant"`
	Version        string     `yaml:"version"`
	Metadata       mcMetadata `yaml:"metadata"`
	ignitionConfig `yaml:",inline"`
}

// machineConfig is what `butane` makes of it.
type machineConfig struct {
	APIVersion string     `yaml:"apiVersion"`
	Kind       string     `yaml:"kind"`
	Metadata   mcMetadata `yaml:"metadata"`
	Spec       struct {
		Config ignitionConfig `yaml:"config"`
	} `yaml:"spec"`
}

// dataURL encodes b as an RFC 2397 data URL, percent-encoding all but
// RFC 3986's unreserved characters, as Butane does for small files.
func dataURL(b []byte) string {
	var s strings.Builder
	s.WriteString("data:,")
	for _, c := range b {
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("-._~", c) >= 0 {
			s.WriteByte(c)
		} else {
			fmt.Fprintf(&s, "%%%02X", c)
		}
	}
	return s.String()
}

func decodeDataURL(t *testing.T, u string) []byte {
	t.Helper()
	rest, ok := strings.CutPrefix(u, "data:")
	if !ok {
		t.Fatalf("%.40q is not a data URL", u)
	}
	header, data, ok := strings.Cut(rest, ",")
	if !ok {
		t.Fatalf("data URL without a comma")
	}
	if strings.HasSuffix(header, ";base64") {
		b, err := base64.StdEncoding.DecodeString(data)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	s, err := url.PathUnescape(data)
	if err != nil {
		t.Fatal(err)
	}
	return []byte(s)
}

func marshalYAML(t *testing.T, header string, v any) []byte {
	t.Helper()
	var b bytes.Buffer
	b.WriteString(header)
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// generateMachineConfigs returns file name -> content of every example.
func generateMachineConfigs(t *testing.T) map[string][]byte {
	unit := repoFile(t, "packaging/ferry.service")
	slice := repoFile(t, "packaging/ferry.slice")
	dropIn := repoFile(t, mcDir+"/"+dropInName)
	config := repoFile(t, mcDir+"/config.toml")
	kubeconfig := repoFile(t, mcDir+"/kubeconfig")
	token := repoFile(t, mcDir+"/peer-token")
	out := map[string][]byte{}
	for _, role := range roles {
		name := "99-" + role + "-ferry"
		meta := mcMetadata{Name: name, Labels: map[string]string{roleLabel: role}}
		units := []mcUnit{{Name: "ferry.service", Enabled: true, Contents: unit, DropIns: []mcDropIn{{Name: dropInName, Contents: dropIn}}},
			{Name: "ferry.slice", Contents: slice}}

		bu := butaneDoc{Variant: "openshift", Version: butaneVer, Metadata: meta}
		bu.Storage.Files = []mcFile{{Path: agent.DefaultConfigPath, Mode: 0o644, Overwrite: true, Contents: mcContents{Inline: config}},
			{Path: kubeconfigPath, Mode: 0o600, Overwrite: true, Contents: mcContents{Inline: kubeconfig}},
			{Path: tokenPath, Mode: 0o600, Overwrite: true, Contents: mcContents{Inline: token}}}
		bu.Systemd.Units = units
		out[name+".bu"] = marshalYAML(t, fmt.Sprintf(`# Butane source of %[1]s.yaml: ferry's config and unit for the %[2]s pool.
# Generated by 'go test ./test/packaging -run TestMachineConfig -update' from
# packaging/ferry.service and ferry.slice, and %[3]s, config.toml,
# kubeconfig and peer-token here.
#   butane %[1]s.bu -o %[1]s.yaml && oc apply -f %[1]s.yaml
# mode 420 is 0644, 384 is 0600.
`, name, role, dropInName), bu)

		mc := machineConfig{APIVersion: "machineconfiguration.openshift.io/v1", Kind: "MachineConfig", Metadata: meta}
		mc.Spec.Config.Ignition = &struct {
			Version string `yaml:"version"`
		}{ignitionVer}
		mc.Spec.Config.Storage.Files = []mcFile{{Path: agent.DefaultConfigPath, Mode: 0o644, Overwrite: true, Contents: mcContents{Source: dataURL([]byte(config))}},
			{Path: kubeconfigPath, Mode: 0o600, Overwrite: true, Contents: mcContents{Source: dataURL([]byte(kubeconfig))}},
			{Path: tokenPath, Mode: 0o600, Overwrite: true, Contents: mcContents{Source: dataURL([]byte(token))}}}
		mc.Spec.Config.Systemd.Units = units
		out[name+".yaml"] = marshalYAML(t, fmt.Sprintf(`# MachineConfig delivering ferry's config and unit to the %[2]s pool, as
# 'butane %[1]s.bu' makes it. Generated by
# 'go test ./test/packaging -run TestMachineConfig -update'.
#   oc apply -f %[1]s.yaml
# The ferry binary must be in /usr/local/bin on each node first: docs/admin.md.
`, name, role), mc)
	}
	out[ndpName] = marshalYAML(t, `# The node disruption policy for ferry's files (OpenShift 4.17+): a change to
# ferry's config, kubeconfig, peer token or unit restarts ferry instead of
# draining and rebooting every node of the pool. Generated by
# 'go test ./test/packaging -run TestMachineConfig -update' from the files
# the MachineConfigs here deliver.
#   oc patch machineconfiguration cluster --type=merge --patch-file nodedisruptionpolicy.yaml
# A merge patch replaces the whole lists: if spec.nodeDisruptionPolicy holds
# entries of your own, add these to them instead (docs/admin.md).
`, nodeDisruptionPolicyFor(t))
	return out
}

// ndpName is the shipped NodeDisruptionPolicy patch.
const ndpName = "nodedisruptionpolicy.yaml"

type ndpAction struct {
	Type    string `yaml:"type"`
	Restart *struct {
		ServiceName string `yaml:"serviceName"`
	} `yaml:"restart,omitempty"`
}

type ndpPolicy struct {
	Spec struct {
		NodeDisruptionPolicy struct {
			Files []struct {
				Path    string      `yaml:"path"`
				Actions []ndpAction `yaml:"actions"`
			} `yaml:"files"`
			Units []struct {
				Name    string      `yaml:"name"`
				Actions []ndpAction `yaml:"actions"`
			} `yaml:"units"`
		} `yaml:"nodeDisruptionPolicy"`
	} `yaml:"spec"`
}

// nodeDisruptionPolicyFor is the MachineConfiguration patch for every file
// and unit the MachineConfigs deliver: ferry reads each at start, so a
// restart applies it (a unit needs systemd's daemon-reload first).
func nodeDisruptionPolicyFor(t *testing.T) any {
	restart := map[string]any{"type": "Restart", "restart": map[string]string{"serviceName": "ferry.service"}}
	var files, units []any
	for _, p := range []string{agent.DefaultConfigPath, kubeconfigPath, tokenPath} {
		files = append(files, map[string]any{"path": p, "actions": []any{restart}})
	}
	for _, u := range []string{"ferry.service", "ferry.slice"} {
		units = append(units, map[string]any{"name": u, "actions": []any{map[string]string{"type": "DaemonReload"}, restart}})
	}
	return map[string]any{
		"apiVersion": "operator.openshift.io/v1",
		"kind":       "MachineConfiguration",
		"metadata":   map[string]string{"name": "cluster"},
		"spec":       map[string]any{"nodeDisruptionPolicy": map[string]any{"files": files, "units": units}},
	}
}

// TestMachineConfig_ANodeDisruptionPolicyForEveryFileFerryShips: every
// file and unit a shipped MachineConfig delivers has an entry that
// restarts ferry, none that reboots, so changing ferry's config never
// reboots a pool (4.17+).
func TestMachineConfig_ANodeDisruptionPolicyForEveryFileFerryShips(t *testing.T) {
	dec := yaml.NewDecoder(strings.NewReader(repoFile(t, mcDir+"/"+ndpName)))
	var ndp ndpPolicy
	if err := dec.Decode(&ndp); err != nil {
		t.Fatal(err)
	}
	restarts := func(acts []ndpAction) bool {
		for _, a := range acts {
			if a.Type == "Reboot" || a.Type == "Drain" {
				return false
			}
		}
		last := acts[len(acts)-1]
		return last.Type == "Restart" && last.Restart != nil && last.Restart.ServiceName == "ferry.service"
	}
	files, units := map[string]bool{}, map[string]bool{}
	for _, f := range ndp.Spec.NodeDisruptionPolicy.Files {
		files[f.Path] = len(f.Actions) > 0 && restarts(f.Actions)
	}
	for _, u := range ndp.Spec.NodeDisruptionPolicy.Units {
		units[u.Name] = len(u.Actions) > 1 && u.Actions[0].Type == "DaemonReload" && restarts(u.Actions)
	}
	mcs, _ := filepath.Glob(filepath.Join(root, mcDir, "99-*-ferry.yaml"))
	if len(mcs) == 0 {
		t.Fatal("no MachineConfig found")
	}
	for _, p := range mcs {
		var mc machineConfig
		if err := yaml.Unmarshal([]byte(repoFile(t, mcDir+"/"+filepath.Base(p))), &mc); err != nil {
			t.Fatal(err)
		}
		for _, f := range mc.Spec.Config.Storage.Files {
			if !files[f.Path] {
				t.Errorf("%s delivers %s, which no node disruption policy entry restarts ferry for", filepath.Base(p), f.Path)
			}
		}
		for _, u := range mc.Spec.Config.Systemd.Units {
			if !units[u.Name] {
				t.Errorf("%s delivers unit %s, which no node disruption policy entry reloads and restarts ferry for", filepath.Base(p), u.Name)
			}
		}
	}
}

// TestMachineConfig_ExamplesMatchTheirSources regenerates the Butane and
// MachineConfig examples and compares them with the committed ones.
func TestMachineConfig_ExamplesMatchTheirSources(t *testing.T) {
	for name, want := range generateMachineConfigs(t) {
		path := filepath.Join(root, mcDir, name)
		if *update {
			if err := os.WriteFile(path, want, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(path)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s/%s is out of date (%v): go test ./test/packaging -run TestMachineConfig -update", mcDir, name, err)
		}
	}
}

// TestMachineConfig_WellFormed parses every example strictly and checks
// what a node gets: the unit as the RPM ships it, enabled, the drop-in, and
// a config the agent loads.
func TestMachineConfig_WellFormed(t *testing.T) {
	unit := repoFile(t, "packaging/ferry.service")
	slice := repoFile(t, "packaging/ferry.slice")
	dropIn := repoFile(t, mcDir+"/"+dropInName)
	for _, role := range roles {
		for _, ext := range []string{".bu", ".yaml"} {
			name := "99-" + role + "-ferry" + ext
			t.Run(name, func(t *testing.T) {
				dec := yaml.NewDecoder(strings.NewReader(repoFile(t, mcDir+"/"+name)))
				dec.KnownFields(true)
				var meta mcMetadata
				var cfg ignitionConfig
				if ext == ".bu" {
					var bu butaneDoc
					if err := dec.Decode(&bu); err != nil {
						t.Fatal(err)
					}
					if bu.Variant != "openshift" || bu.Version != butaneVer {
						t.Errorf("variant %s %s, want openshift %s", bu.Variant, bu.Version, butaneVer)
					}
					meta, cfg = bu.Metadata, bu.ignitionConfig
				} else {
					var mc machineConfig
					if err := dec.Decode(&mc); err != nil {
						t.Fatal(err)
					}
					if mc.APIVersion != "machineconfiguration.openshift.io/v1" || mc.Kind != "MachineConfig" {
						t.Errorf("apiVersion %q kind %q", mc.APIVersion, mc.Kind)
					}
					if mc.Spec.Config.Ignition == nil || mc.Spec.Config.Ignition.Version != ignitionVer {
						t.Errorf("ignition version %+v, want %s", mc.Spec.Config.Ignition, ignitionVer)
					}
					meta, cfg = mc.Metadata, mc.Spec.Config
				}
				if meta.Labels[roleLabel] != role || meta.Name != "99-"+role+"-ferry" {
					t.Errorf("metadata %+v: want name 99-%s-ferry, label %s=%s", meta, role, roleLabel, role)
				}

				files := cfg.Storage.Files
				if len(files) != 3 || files[0].Path != agent.DefaultConfigPath || files[1].Path != kubeconfigPath || files[1].Mode != 0o600 ||
					files[2].Path != tokenPath || files[2].Mode != 0o600 {
					t.Fatalf("files %+v: want %s, %s and %s (mode 0600)", files, agent.DefaultConfigPath, kubeconfigPath, tokenPath)
				}
				body := func(f mcFile) []byte {
					if ext == ".yaml" {
						return decodeDataURL(t, f.Contents.Source)
					}
					return []byte(f.Contents.Inline)
				}
				dir := t.TempDir()
				p := filepath.Join(dir, "config.toml")
				if err := os.WriteFile(p, body(files[0]), 0o644); err != nil {
					t.Fatal(err)
				}
				c, err := agent.LoadConfig(p, true)
				if err != nil {
					t.Errorf("the delivered config does not load: %v", err)
				}
				if c.Peer.TokenFile != tokenPath || c.Peer.Closed() {
					t.Errorf("the config's token_file %q, the MachineConfig delivers %s", c.Peer.TokenFile, tokenPath)
				}
				if c.Cluster.Kubeconfig != kubeconfigPath {
					t.Errorf("the config names kubeconfig %q, the MachineConfig delivers %s", c.Cluster.Kubeconfig, kubeconfigPath)
				}
				// No credential travels in a MachineConfig (the machine config
				// server hands it to anyone who asks for Ignition): the
				// kubeconfig names the node's own token file.
				if kcBody := string(body(files[1])); !strings.Contains(kcBody, "tokenFile: /var/lib/ferry/token") ||
					strings.Contains(kcBody, "token:") || strings.Contains(kcBody, "client-key") {
					t.Errorf("the delivered kubeconfig carries a credential or no tokenFile /var/lib/ferry/token:\n%s", kcBody)
				}
				kc := filepath.Join(dir, "kubeconfig")
				if err := os.WriteFile(kc, body(files[1]), 0o600); err != nil {
					t.Fatal(err)
				}
				if _, err := kube.New(kc, nil); err == nil || !strings.Contains(err.Error(), "certificate-authority") {
					// The example parses as far as the CA, which only a node has.
					t.Errorf("the delivered kubeconfig: %v", err)
				}

				if len(cfg.Systemd.Units) != 2 {
					t.Fatalf("units %+v: want ferry.service and ferry.slice", cfg.Systemd.Units)
				}
				if sl := cfg.Systemd.Units[1]; sl.Name != "ferry.slice" || sl.Contents != slice || len(sl.DropIns) != 0 {
					t.Errorf("unit %s: want ferry.slice as packaging/ferry.slice", sl.Name)
				}
				u := cfg.Systemd.Units[0]
				if u.Name != "ferry.service" || !u.Enabled {
					t.Errorf("unit %s enabled=%v, want ferry.service enabled", u.Name, u.Enabled)
				}
				if u.Contents != unit {
					t.Error("the unit differs from packaging/ferry.service")
				}
				if len(u.DropIns) != 1 || u.DropIns[0].Name != dropInName || u.DropIns[0].Contents != dropIn {
					t.Errorf("drop-ins %+v: want %s", u.DropIns, dropInName)
				}
			})
		}
	}
}

// TestMachineConfig_OwnsNothingFerryWrites checks that no MachineConfig
// file is one ferry writes, so the MCO and ferry never fight over a file
// (a file the MCO owns and finds changed degrades the node).
func TestMachineConfig_OwnsNothingFerryWrites(t *testing.T) {
	def := agent.DefaultConfig()
	written := []string{
		filepath.Join(def.Paths.CRIOConfDir, "pin-upgrade.conf"),
		filepath.Join(def.Paths.RegistriesConfDir, "pin-upgrade.conf"),
		def.Paths.CertsDir + "/127.0.0.1:",
		def.Paths.StateDir + "/",
		def.Paths.ExtractDir + "/",
		"/run/",
	}
	for _, role := range roles {
		var mc machineConfig
		if err := yaml.Unmarshal([]byte(repoFile(t, mcDir+"/99-"+role+"-ferry.yaml")), &mc); err != nil {
			t.Fatal(err)
		}
		for _, f := range mc.Spec.Config.Storage.Files {
			for _, w := range written {
				if f.Path == w || strings.HasPrefix(f.Path, w) {
					t.Errorf("99-%s-ferry delivers %s, which ferry writes (%s)", role, f.Path, w)
				}
			}
		}
	}
}

// TestMachineConfig_DropInVerifies runs systemd-analyze verify on the unit
// with the MachineConfig drop-in, as a node without layering runs it.
func TestMachineConfig_DropInVerifies(t *testing.T) {
	analyze := needTool(t, "systemd-analyze", "systemd")
	r := t.TempDir()
	for _, d := range []string{"usr/bin", "usr/local/bin", "usr/lib/systemd", "etc/systemd/system/ferry.service.d"} {
		if err := os.MkdirAll(filepath.Join(r, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	run(t, "", "cp", "-a", "/usr/lib/systemd/system", filepath.Join(r, "usr/lib/systemd/"))
	run(t, "", "cp", "/usr/bin/mkdir", filepath.Join(r, "usr/bin/mkdir"))
	if err := os.WriteFile(filepath.Join(r, "usr/local/bin/ferry"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	run(t, "", "cp", filepath.Join(root, "packaging/ferry.service"), filepath.Join(root, "packaging/ferry.slice"), filepath.Join(r, "etc/systemd/system/"))
	run(t, "", "cp", filepath.Join(root, mcDir, dropInName), filepath.Join(r, "etc/systemd/system/ferry.service.d/"))
	out, err := runErr(t, "", analyze, "verify", "--root="+r, "ferry.service")
	if err != nil || strings.TrimSpace(out) != "" {
		t.Fatalf("systemd-analyze verify with %s: %v\n%s", dropInName, err, out)
	}
}
