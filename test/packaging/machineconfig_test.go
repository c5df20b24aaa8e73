package packaging

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/internal/dataurl"
)

var update = flag.Bool("update", false, "rewrite packaging/machineconfig/*.bu and *.yaml from their sources")

// The MachineConfig examples are generated from these sources, so they
// cannot drift from what the RPM ships:
//
//	packaging/ferry.service                     the unit, unchanged
//	packaging/ferry.slice                       its slice, unchanged
//	packaging/machineconfig/10-local-binary.conf  a drop-in running /usr/local/bin/ferry
//	packaging/machineconfig/<each shippedFile's src>
//
// They hold no ferry binary: a stick brings it, and the installer they
// ship (ferry-install, started by the udev rule) checks it against the
// trust list they ship before it runs (docs/admin.md).
const (
	mcDir       = "packaging/machineconfig"
	dropInName  = "10-local-binary.conf"
	trustPath   = "/etc/ferry/trusted-binaries.sha256"
	ignitionVer = "3.4.0"  // what Butane's openshift 4.14.0 variant emits
	butaneVer   = "4.14.0" // oldest OpenShift with Ignition 3.4
	roleLabel   = "machineconfiguration.openshift.io/role"
	// kubeletKubeconfig is the node's own credential, which the config
	// names and no MachineConfig carries.
	kubeletKubeconfig = "/var/lib/kubelet/kubeconfig"
	// maxMachineConfig bounds each generated MachineConfig: a cluster
	// object every node's MCD reads, never a place for a binary.
	maxMachineConfig = 64 << 10
)

// ndp actions, as the MachineConfiguration API spells them.
var (
	restartFerry = map[string]any{"type": "Restart", "restart": map[string]string{"serviceName": "ferry.service"}}
	daemonReload = map[string]any{"type": "DaemonReload"}
	noAction     = map[string]any{"type": "None"}
	reloadUdev   = map[string]any{"type": "Reload", "reload": map[string]string{"serviceName": "systemd-udevd.service"}}
)

// shippedFile is one file a MachineConfig delivers, and what the node does
// when it changes (its node disruption policy entry): never a reboot.
type shippedFile struct {
	path string
	mode int
	src  string // under mcDir
	ndp  []any
	why  string // of the ndp actions, for the generated policy's header
}

var shipped = []shippedFile{
	{agent.DefaultConfigPath, 0o644, "config.toml", []any{restartFerry}, "ferry reads its config at start"},
	// Read at each plug: a new digest takes effect at the next stick.
	{trustPath, 0o644, "trusted-binaries.sha256", []any{noAction}, "read at each plug"},
	{"/etc/ferry/install-policy", 0o644, "install-policy", []any{noAction}, "read at each plug"},
	{"/etc/ferry/ferry-install", 0o755, "ferry-install", []any{noAction}, "run at each plug"},
	{"/etc/udev/rules.d/80-ferry-install.rules", 0o644, "80-ferry-install.rules", []any{reloadUdev}, "udev reloads its rules"},
	// A template unit travels as a file: the policy API cannot name one.
	{"/etc/systemd/system/ferry-install@.service", 0o644, "ferry-install@.service", []any{daemonReload}, "systemd reloads its units"},
}

// installerUnits are the peers' installer and its timer, units of their
// own (the timer enabled): with them one plug updates every node.
var installerUnits = []struct {
	name    string
	enabled bool
	ndp     []any
}{
	{"ferry-install-peers.service", false, []any{daemonReload}},
	{"ferry-install-peers.timer", true, []any{daemonReload, map[string]any{"type": "Restart", "restart": map[string]string{"serviceName": "ferry-install-peers.timer"}}}},
}

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
	b, err := dataurl.Decode(u)
	if err != nil {
		t.Fatal(err)
	}
	return b
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
	out := map[string][]byte{}
	var srcs []string
	for _, f := range shipped {
		srcs = append(srcs, f.src)
	}
	for _, role := range roles {
		name := "99-" + role + "-ferry"
		meta := mcMetadata{Name: name, Labels: map[string]string{roleLabel: role}}
		units := []mcUnit{{Name: "ferry.service", Enabled: true, Contents: unit, DropIns: []mcDropIn{{Name: dropInName, Contents: dropIn}}},
			{Name: "ferry.slice", Contents: slice}}
		for _, u := range installerUnits {
			units = append(units, mcUnit{Name: u.name, Enabled: u.enabled, Contents: repoFile(t, mcDir+"/"+u.name)})
		}

		bu := butaneDoc{Variant: "openshift", Version: butaneVer, Metadata: meta}
		mc := machineConfig{APIVersion: "machineconfiguration.openshift.io/v1", Kind: "MachineConfig", Metadata: meta}
		mc.Spec.Config.Ignition = &struct {
			Version string `yaml:"version"`
		}{ignitionVer}
		for _, f := range shipped {
			body := repoFile(t, mcDir+"/"+f.src)
			bu.Storage.Files = append(bu.Storage.Files, mcFile{Path: f.path, Mode: f.mode, Overwrite: true, Contents: mcContents{Inline: body}})
			mc.Spec.Config.Storage.Files = append(mc.Spec.Config.Storage.Files, mcFile{Path: f.path, Mode: f.mode, Overwrite: true, Contents: mcContents{Source: dataURL([]byte(body))}})
		}
		bu.Systemd.Units = units
		mc.Spec.Config.Systemd.Units = units
		out[name+".bu"] = marshalYAML(t, fmt.Sprintf(`# Butane source of %[1]s.yaml: ferry's config, unit, installer and trust
# list for the %[2]s pool. No ferry binary: a stick brings it (docs/admin.md).
# Generated by 'go test ./test/packaging -run TestMachineConfig -update' from
# packaging/ferry.service and ferry.slice, and %[3]s,
# %[4]s here.
#   butane %[1]s.bu -o %[1]s.yaml && oc apply -f %[1]s.yaml
# mode 420 is 0644, 493 is 0755.
`, name, role, dropInName, strings.Join(append(srcs, installerUnits[0].name, installerUnits[1].name), ", ")), bu)
		out[name+".yaml"] = marshalYAML(t, fmt.Sprintf(`# MachineConfig delivering ferry's config, unit, installer and trust list
# to the %[2]s pool, as 'butane %[1]s.bu' makes it. Generated by
# 'go test ./test/packaging -run TestMachineConfig -update'.
#   oc apply -f %[1]s.yaml
# The ferry binary comes on a stick, on one node; ferry-install installs it
# as /usr/local/bin/ferry, from the stick or from a peer that runs it, only
# if trusted-binaries.sha256 lists its sha256 (docs/admin.md, "With a
# MachineConfig and a stick").
`, name, role), mc)
	}
	var why strings.Builder
	for _, f := range shipped {
		fmt.Fprintf(&why, "#   %s: %s\n", f.path, f.why)
	}
	out[ndpName] = marshalYAML(t, `# The node disruption policy for ferry's files (OpenShift 4.17+): a change to
# any file or unit ferry's MachineConfigs deliver restarts or reloads what
# reads it, instead of draining and rebooting every node of the pool:
#   ferry.service, ferry.slice: systemd reloads its units, ferry restarts
#   ferry-install-peers.service, .timer: systemd reloads its units, the timer restarts
`+why.String()+`# Generated by 'go test ./test/packaging -run TestMachineConfig -update' from
# the files the MachineConfigs here deliver.
#   oc patch machineconfiguration cluster --type=merge --patch-file nodedisruptionpolicy.yaml
# A merge patch replaces the whole lists: if spec.nodeDisruptionPolicy holds
# entries of your own, add these to them instead (docs/admin.md).
`, nodeDisruptionPolicyFor())
	return out
}

// ndpName is the shipped NodeDisruptionPolicy patch.
const ndpName = "nodedisruptionpolicy.yaml"

type ndpAction struct {
	Type    string `yaml:"type"`
	Restart *struct {
		ServiceName string `yaml:"serviceName"`
	} `yaml:"restart,omitempty"`
	Reload *struct {
		ServiceName string `yaml:"serviceName"`
	} `yaml:"reload,omitempty"`
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
// and unit the MachineConfigs deliver.
func nodeDisruptionPolicyFor() any {
	var files, units []any
	for _, f := range shipped {
		files = append(files, map[string]any{"path": f.path, "actions": f.ndp})
	}
	for _, u := range []string{"ferry.service", "ferry.slice"} {
		units = append(units, map[string]any{"name": u, "actions": []any{daemonReload, restartFerry}})
	}
	for _, u := range installerUnits {
		units = append(units, map[string]any{"name": u.name, "actions": u.ndp})
	}
	return map[string]any{
		"apiVersion": "operator.openshift.io/v1",
		"kind":       "MachineConfiguration",
		"metadata":   map[string]string{"name": "cluster"},
		"spec":       map[string]any{"nodeDisruptionPolicy": map[string]any{"files": files, "units": units}},
	}
}

// ndpServiceName is the MachineConfiguration API's rule for a unit or
// service name (operator/v1 NodeDisruptionPolicyServiceName): no '@', so
// no template unit can have an entry.
var ndpServiceName = regexp.MustCompile(`^[a-zA-Z0-9:._\\-]+\.(service|socket|device|mount|automount|swap|target|path|timer|snapshot|slice|scope)$`)

// checkActions says what is wrong with one entry's actions, as the API
// would refuse them or as they would disrupt the node.
func checkActions(acts []ndpAction) string {
	if len(acts) == 0 || len(acts) > 10 {
		return fmt.Sprintf("%d actions (the API takes 1 to 10)", len(acts))
	}
	for _, a := range acts {
		switch a.Type {
		case "Reboot", "Drain":
			return a.Type + ": ferry's files never need one"
		case "None":
			if len(acts) != 1 {
				return "None with other actions (the API refuses it)"
			}
		case "Restart":
			if a.Restart == nil || !ndpServiceName.MatchString(a.Restart.ServiceName) || a.Reload != nil {
				return fmt.Sprintf("Restart without a valid restart.serviceName (%+v)", a.Restart)
			}
		case "Reload":
			if a.Reload == nil || !ndpServiceName.MatchString(a.Reload.ServiceName) || a.Restart != nil {
				return fmt.Sprintf("Reload without a valid reload.serviceName (%+v)", a.Reload)
			}
		case "DaemonReload":
		default:
			return "unknown action " + a.Type
		}
	}
	return ""
}

// TestMachineConfig_ANodeDisruptionPolicyForEveryFileFerryShips: every
// file and unit a shipped MachineConfig delivers has a node disruption
// policy entry the API accepts, none that reboots or drains, so neither
// ferry's config, nor a unit, nor a new trusted build in the trust list
// ever reboots a pool (4.17+). What ferry reads at start restarts ferry;
// a unit gets systemd's daemon-reload first.
func TestMachineConfig_ANodeDisruptionPolicyForEveryFileFerryShips(t *testing.T) {
	dec := yaml.NewDecoder(strings.NewReader(repoFile(t, mcDir+"/"+ndpName)))
	dec.KnownFields(true)
	var ndp struct {
		APIVersion string            `yaml:"apiVersion"`
		Kind       string            `yaml:"kind"`
		Metadata   map[string]string `yaml:"metadata"`
		ndpPolicy  `yaml:",inline"`
	}
	if err := dec.Decode(&ndp); err != nil {
		t.Fatal(err)
	}
	if ndp.APIVersion != "operator.openshift.io/v1" || ndp.Kind != "MachineConfiguration" || ndp.Metadata["name"] != "cluster" {
		t.Errorf("%s patches %s %s %v, want operator.openshift.io/v1 MachineConfiguration cluster", ndpName, ndp.APIVersion, ndp.Kind, ndp.Metadata)
	}
	restartsFerry := func(acts []ndpAction) bool {
		last := acts[len(acts)-1]
		return last.Type == "Restart" && last.Restart != nil && last.Restart.ServiceName == "ferry.service"
	}
	files, units := map[string][]ndpAction{}, map[string][]ndpAction{}
	for _, f := range ndp.Spec.NodeDisruptionPolicy.Files {
		if bad := checkActions(f.Actions); bad != "" {
			t.Errorf("%s: file %s: %s", ndpName, f.Path, bad)
			continue
		}
		files[f.Path] = f.Actions
	}
	for _, u := range ndp.Spec.NodeDisruptionPolicy.Units {
		if !ndpServiceName.MatchString(u.Name) {
			t.Errorf("%s: unit %q: the MachineConfiguration API refuses that name", ndpName, u.Name)
		}
		if bad := checkActions(u.Actions); bad != "" {
			t.Errorf("%s: unit %s: %s", ndpName, u.Name, bad)
			continue
		}
		units[u.Name] = u.Actions
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
			acts, ok := files[f.Path]
			switch {
			case !ok:
				t.Errorf("%s delivers %s, which has no node disruption policy entry: changing it would reboot the pool", filepath.Base(p), f.Path)
			case f.Path == agent.DefaultConfigPath && !restartsFerry(acts):
				t.Errorf("%s: %s, which ferry reads at start, does not restart ferry.service", ndpName, f.Path)
			case strings.HasPrefix(f.Path, "/etc/systemd/system/") && acts[0].Type != "DaemonReload":
				t.Errorf("%s: the unit file %s does not get a daemon-reload", ndpName, f.Path)
			case strings.HasPrefix(f.Path, "/etc/udev/rules.d/") && (acts[0].Type != "Reload" || acts[0].Reload.ServiceName != "systemd-udevd.service"):
				t.Errorf("%s: the udev rule %s does not reload systemd-udevd.service", ndpName, f.Path)
			}
		}
		for _, u := range mc.Spec.Config.Systemd.Units {
			acts, ok := units[u.Name]
			if ok && strings.HasPrefix(u.Name, "ferry-install-peers.") {
				// the peers' installer: its units reloaded, the timer restarted
				if acts[0].Type != "DaemonReload" || strings.HasSuffix(u.Name, ".timer") && (len(acts) != 2 || acts[1].Restart == nil || acts[1].Restart.ServiceName != u.Name) {
					t.Errorf("%s delivers unit %s, which no node disruption policy entry reloads (and restarts, for the timer)", filepath.Base(p), u.Name)
				}
				continue
			}
			if !ok || len(acts) < 2 || acts[0].Type != "DaemonReload" || !restartsFerry(acts) {
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

// loadShippedConfig loads the config a MachineConfig delivers with the
// agent's own parser.
//
// loadShippedConfig parses the delivered config as the agent does
// (strictly) and checks that its peers use the kubelet's certificates.
func loadShippedConfig(t *testing.T, body []byte) agent.Config {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(p, body, 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := agent.LoadConfig(p, true)
	if err != nil {
		t.Fatalf("the delivered config does not load: %v", err)
	}
	if !c.Peer.NodeIdentity() {
		t.Errorf("the delivered config's [peer] identity = %q, want \"node\" (peers use the kubelet's certificates)", c.Peer.Identity)
	}
	return c
}

// TestMachineConfig_WellFormed parses every example strictly and checks
// what a node gets: the unit as the RPM ships it, enabled, the drop-in,
// each shipped file as its source with its mode, and a config the agent
// loads that names the kubelet's kubeconfig.
func TestMachineConfig_WellFormed(t *testing.T) {
	unit := repoFile(t, "packaging/ferry.service")
	slice := repoFile(t, "packaging/ferry.slice")
	dropIn := repoFile(t, mcDir+"/"+dropInName)
	for _, role := range roles {
		for _, ext := range []string{".bu", ".yaml"} {
			name := "99-" + role + "-ferry" + ext
			t.Run(name, func(t *testing.T) {
				meta, cfg := decodeExample(t, name)
				if meta.Labels[roleLabel] != role || meta.Name != "99-"+role+"-ferry" {
					t.Errorf("metadata %+v: want name 99-%s-ferry, label %s=%s", meta, role, roleLabel, role)
				}

				files := cfg.Storage.Files
				if len(files) != len(shipped) {
					t.Fatalf("%d files, want %d: %+v", len(files), len(shipped), files)
				}
				body := func(f mcFile) []byte {
					if ext == ".yaml" {
						return decodeDataURL(t, f.Contents.Source)
					}
					return []byte(f.Contents.Inline)
				}
				for i, want := range shipped {
					f := files[i]
					if f.Path != want.path || f.Mode != want.mode || !f.Overwrite {
						t.Errorf("file %d: %s mode %#o overwrite=%v, want %s mode %#o overwrite", i, f.Path, f.Mode, f.Overwrite, want.path, want.mode)
					}
					if string(body(f)) != repoFile(t, mcDir+"/"+want.src) {
						t.Errorf("%s differs from %s/%s", f.Path, mcDir, want.src)
					}
				}
				c := loadShippedConfig(t, body(files[0]))
				if c.Peer.TokenFile != "" {
					t.Errorf("the config's token_file %q: no shared peer token any more", c.Peer.TokenFile)
				}
				if c.Cluster.Kubeconfig != kubeletKubeconfig {
					t.Errorf("the config names kubeconfig %q, want the kubelet's %s", c.Cluster.Kubeconfig, kubeletKubeconfig)
				}

				if len(cfg.Systemd.Units) != 2+len(installerUnits) {
					t.Fatalf("units %+v: want ferry.service, ferry.slice and the peers' installer and timer", cfg.Systemd.Units)
				}
				for i, want := range installerUnits {
					u := cfg.Systemd.Units[2+i]
					if u.Name != want.name || u.Enabled != want.enabled || u.Contents != repoFile(t, mcDir+"/"+want.name) {
						t.Errorf("unit %s enabled=%v: want %s as %s/%s, enabled=%v", u.Name, u.Enabled, want.name, mcDir, want.name, want.enabled)
					}
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

// decodeExample parses one generated example strictly.
func decodeExample(t *testing.T, name string) (mcMetadata, ignitionConfig) {
	t.Helper()
	dec := yaml.NewDecoder(strings.NewReader(repoFile(t, mcDir+"/"+name)))
	dec.KnownFields(true)
	if strings.HasSuffix(name, ".bu") {
		var bu butaneDoc
		if err := dec.Decode(&bu); err != nil {
			t.Fatal(err)
		}
		if bu.Variant != "openshift" || bu.Version != butaneVer {
			t.Errorf("variant %s %s, want openshift %s", bu.Variant, bu.Version, butaneVer)
		}
		return bu.Metadata, bu.ignitionConfig
	}
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
	return mc.Metadata, mc.Spec.Config
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
		"/usr/local/bin/ferry", // ferry-install's, from a stick
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
