package agent

import (
	"errors"
	"fmt"
	"github.com/ferry-edge/ferry/agent/machine"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"

	"github.com/BurntSushi/toml"
	"gopkg.in/yaml.v3"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/internal/pacing"
	"github.com/ferry-edge/ferry/pull/pullspec"
)

// DefaultConfigPath is where the agent reads its config when no --config
// is given; a missing file there means "all defaults".
const DefaultConfigPath = "/etc/ferry/config.toml"

// Config is /etc/ferry/config.toml. Every key is documented in
// docs/admin.md; a test checks that list against this struct.
type Config struct {
	// NodeName identifies this node to its peers; default: the hostname.
	NodeName string `toml:"node_name"`
	// Arch is the node's architecture (uname -m); default: this binary's.
	Arch string `toml:"arch"`
	// ApprovedDigests are bundle sha256 digests an engineer approved.
	ApprovedDigests []string `toml:"approved_digests"`
	// TrustedKeys are paths of minisign public keys; a bundle with a valid
	// signature by one of them is approved.
	TrustedKeys []string `toml:"trusted_keys"`
	// Approval is whether a bundle must be approved to be loaded
	// (ApprovalModes).
	Approval machine.ApprovalMode `toml:"approval"`

	Paths     Paths     `toml:"paths"`
	CRIO      CRIO      `toml:"crio"`
	Registry  Registry  `toml:"registry"`
	Peer      Peer      `toml:"peer"`
	Cluster   Cluster   `toml:"cluster"`
	Media     Media     `toml:"media"`
	Pacing    Pacing    `toml:"pacing"`
	Retention Retention `toml:"retention"`
	Pull      Pull      `toml:"pull"`
}

// Pull is registry mode (ferry load --release): how a release is copied
// from the site's registry over its link.
type Pull struct {
	// RateLimit bounds the bytes per second taken from the link ("2MiB",
	// "20M"); "" takes what the link gives.
	RateLimit string `toml:"rate_limit"`
	// Window is when the link may be used, in local time ("22:00-06:00");
	// "" is always. A pull the window's end stops resumes at its next
	// opening.
	Window string `toml:"window"`
	// PullSecret is a docker config.json with the registry's credentials;
	// OpenShift keeps the cluster's at /var/lib/kubelet/config.json. The
	// images come from where the node's registries.conf and
	// paths.registries_conf_dir send CRI-O's pulls (their mirrors, the
	// ImageDigestMirrorSets OpenShift renders there), through certs_dir.
	PullSecret string `toml:"pull_secret"`
	// SignatureStore is a URL the release's signature files are asked for
	// ("" none: the registry's sigstore signatures still come).
	SignatureStore string `toml:"signature_store"`
}

// Retention is what a node keeps of the release it runs once its upgrade
// is done, until the next upgrade is done: without a registry on the
// site, the only other copy of its images is CRI-O's own storage.
type Retention struct {
	// KeepRunningRelease keeps the upgraded bundle's extracted tree (its
	// size on disk: the bundle's), to load its images into CRI-O again when
	// they go missing (CRI-O wiped its storage after an unclean stop) and
	// to serve it to a node that joins later or comes back empty. false
	// frees the disk at the upgrade's end, as ferry did before.
	KeepRunningRelease bool `toml:"keep_running_release"`
	// CheckMinutes is how often CRI-O is asked whether it still holds
	// every image of the running release, besides each time CRI-O
	// restarts; 0 checks only then.
	CheckMinutes int `toml:"check_minutes"`
}

// Pacing is how ferry's bulk work (extraction's writes, peer fetches and
// serving, the load's pulls) yields to the node's own work by the
// kernel's pressure stall information (docs/design.md, "Pacing").
type Pacing struct {
	// Enabled holds the bulk work back while the node stalls; false runs
	// it at full speed always (the unit's CPU and IO weights still apply).
	Enabled bool `toml:"enabled"`
	// Politeness is how soon it holds back: "etcd-safe" (the default: IO
	// stalls over 10% of the time, CPU over 80%), "balanced" (25%, 90%)
	// or "eager" (50%, CPU never).
	Politeness string `toml:"politeness"`
	// Watch is whose pressure counts: "" (auto) the pods' cgroup where
	// the node has one with pressure (cgroup v2), else the whole node;
	// or a directory, /proc/pressure or a cgroup v2 one.
	Watch string `toml:"watch"`
}

// Media is how bundles arrive on removable media.
type Media struct {
	// Detect is "automatic" (udev: a plugged stick is mounted read-only or
	// read raw) or "manual" (no mounts, no reads of plugged devices: only
	// `ferry load`).
	Detect string `toml:"detect"`
	// AllowDevices are the kinds of block device read for bundles besides
	// USB and MMC ones (always read): "loop", "virtio", "nvme", "scsi",
	// "ata", "removable" (the disk's removable flag, which a SCSI target
	// sets as it likes), or "any" (every block device this node does not
	// use itself). Empty by default: a network LUN, a hot-plugged virtio or
	// NVMe disk or a tenant's raw block volume is not a stick.
	AllowDevices []string `toml:"allow_devices"`
	// ExtraFilesystems are filesystems mounted on a stick besides vfat,
	// exFAT and iso9660 (a raw stick is always read): "ext2", "ext3",
	// "ext4", "xfs". Empty by default: their kernel drivers are not
	// hardened against a crafted image, and a technician's stick needs none.
	ExtraFilesystems []string `toml:"extra_filesystems"`
}

// StickFilesystems are the filesystems media.extra_filesystems may name
// (media.ExtraFilesystems).
var StickFilesystems = []string{"ext2", "ext3", "ext4", "xfs"}

// DeviceKinds are the kinds media.allow_devices may name (media.DeviceKinds
// and media.StickKinds).
var DeviceKinds = []string{"loop", "virtio", "nvme", "scsi", "ata", "any", "removable", "usb", "mmc"}

// Automatic reports whether plugged devices are watched.
func (m Media) Automatic() bool { return m.Detect != "manual" }

// Paths are every place the agent reads or writes, so that tests can run it
// in a scratch root.
type Paths struct {
	StateDir          string `toml:"state_dir"`
	ExtractDir        string `toml:"extract_dir"`
	MountDir          string `toml:"mount_dir"`
	Socket            string `toml:"socket"`
	CRIOConfDir       string `toml:"crio_conf_dir"`
	RegistriesConfDir string `toml:"registries_conf_dir"`
	CertsDir          string `toml:"certs_dir"`
	// SignaturePolicy is the containers policy.json CRI-O applies to
	// pulls; every bundle is checked against it before it is shared or
	// loaded. RegistriesD is the containers registries.d directory, where
	// ferry says that its mirror serves sigstore attachments.
	SignaturePolicy string `toml:"signature_policy"`
	RegistriesD     string `toml:"registries_d"`
}

// CRIO says how to reach and reload CRI-O.
type CRIO struct {
	// Socket is CRI-O's CRI socket; "" means this node only verifies,
	// extracts and shares bundles, and loads nothing.
	Socket string `toml:"socket"`
	// Reload is "systemd" (ReloadUnit over D-Bus), "signal" (SIGHUP to the
	// pid in PidFile) or "none".
	Reload  string `toml:"reload"`
	Unit    string `toml:"unit"`
	PidFile string `toml:"pid_file"`
	// PullWorkers bounds concurrent CRI pulls; 0 sizes it from the cores.
	PullWorkers int `toml:"pull_workers"`
	// StorageDir is CRI-O's image store, checked for room before loading.
	StorageDir string `toml:"storage_dir"`
	// StorageFloorBytes is kept free in StorageDir beyond what a load
	// writes there.
	StorageFloorBytes int64 `toml:"storage_floor_bytes"`
	// KubeletConfig is the kubelet's configuration, read for its image
	// GC and eviction thresholds (defaults 85% used, 15% free when absent).
	KubeletConfig string `toml:"kubelet_config"`
}

// Registry is the embedded registry serving the extracted bundle.
type Registry struct {
	// Port on 127.0.0.1; 0 chooses one at first start and keeps it.
	Port int `toml:"port"`
}

// Peer is peer-to-peer distribution between the cluster's nodes.
type Peer struct {
	// Listen is the address the peer server listens on; "" disables it.
	Listen string `toml:"listen"`
	// Peers are the other nodes' peer addresses (host:port).
	Peers []string `toml:"peers"`
	// TokenFile holds a bearer token shared by the cluster's nodes.
	TokenFile string `toml:"token_file"`
	// Open serves bundles to anyone who can reach Listen when there is no
	// token; without it (the default) a node with no token serves nothing.
	Open bool `toml:"open"`
	// Identity is how peers know each other: "token" (TokenFile, over
	// HTTP) or "node" (HTTPS, each node with its kubelet's certificates,
	// checked against the cluster's CAs: nothing to hand out; it needs
	// cluster.kubeconfig with the kubelet's certificate). Unset, it is
	// "node" when cluster.kubeconfig authenticates with a client
	// certificate (the kubelet's), else "token".
	Identity string `toml:"identity"`
	// Cert and Key are the serving certificate and key with Identity
	// "node" (one file may hold both); default the kubelet's
	// /var/lib/kubelet/pki/kubelet-server-current.pem.
	Cert string `toml:"cert"`
	Key  string `toml:"key"`
	// ClientCA and ServingCA are CA bundles (files) that a peer's client
	// and serving certificates must chain to with Identity "node"; ""
	// reads them from the cluster's API (the API server's client CA,
	// kube-system/extension-apiserver-authentication, and
	// openshift-config-managed/kubelet-serving-ca).
	ClientCA  string `toml:"client_ca"`
	ServingCA string `toml:"serving_ca"`
	// Serial distributes as before cut-through: the stick's node offers
	// the bundle only once it is extracted, and a fetching node keeps the
	// whole tar, then extracts it (twice the bundle on its disk). For
	// comparison (make bench), not for use.
	Serial bool `toml:"serial"`

	// identityDefaulted: Identity is "node" because the kubeconfig is a
	// node's (Validate), which an error about it says.
	identityDefaulted bool
}

// ApprovalOff reports whether the config turned approval off.
func (c *Config) ApprovalOff() bool { return c.Approval == machine.ApprovalModeOff }

// Closed reports whether the peer server refuses everyone (no token, not
// open).
func (p Peer) Closed() bool { return !p.NodeIdentity() && p.TokenFile == "" && !p.Open }

// NodeIdentity reports peers that authenticate with node identities.
func (p Peer) NodeIdentity() bool { return p.Identity == PeerIdentityNode }

// Peer identities (peer.identity).
const (
	PeerIdentityToken = "token"
	PeerIdentityNode  = "node"
	// DefaultPeerCert is the kubelet's serving certificate and key on an
	// OpenShift node, rotated by the kubelet.
	DefaultPeerCert = "/var/lib/kubelet/pki/kubelet-server-current.pem"
)

// Cluster is the gate that lets the cluster upgrade proceed.
type Cluster struct {
	// Schedule is "Automatic" (run OnReady when every node is loaded) or
	// "Manual" (only report; `ferry proceed` runs it).
	Schedule string `toml:"schedule"`
	// OnReady is the hook's argv; FERRY_RELEASE holds the release reference.
	OnReady []string `toml:"on_ready"`
	// Kubeconfig, when set, lets the agent start and follow the cluster
	// upgrade through the Kubernetes API and annotate its Node.
	Kubeconfig string `toml:"kubeconfig"`
	// ForceUnsigned sets force: true on the desired update, for a release
	// the cluster cannot verify. Off unless an administrator says so.
	ForceUnsigned bool `toml:"force_unsigned"`
}

// DefaultConfig is what a node gets with no config file.
func DefaultConfig() Config {
	host, _ := os.Hostname()
	return Config{
		NodeName: host,
		Arch:     bundle.UnameArch(runtime.GOARCH),
		Approval: machine.ApprovalModeRequired,
		Paths: Paths{
			StateDir:          "/var/lib/ferry",
			ExtractDir:        "/var/lib/upgrade",
			MountDir:          "/run/ferry/media",
			Socket:            "/run/ferry/ferry.sock",
			CRIOConfDir:       "/etc/crio/crio.conf.d",
			RegistriesConfDir: "/etc/containers/registries.conf.d",
			CertsDir:          "/etc/containers/certs.d",
			SignaturePolicy:   "/etc/containers/policy.json",
			RegistriesD:       "/etc/containers/registries.d",
		},
		CRIO: CRIO{
			Socket:            "/var/run/crio/crio.sock",
			Reload:            "systemd",
			Unit:              "crio.service",
			PidFile:           "/var/run/crio/crio.pid",
			StorageDir:        "/var/lib/containers/storage",
			StorageFloorBytes: 1 << 30,
			KubeletConfig:     "/etc/kubernetes/kubelet.conf",
		},
		Peer:      Peer{Listen: ":8090"},
		Cluster:   Cluster{Schedule: "Automatic"},
		Media:     Media{Detect: "automatic"},
		Pacing:    Pacing{Enabled: true, Politeness: pacing.DefaultPoliteness},
		Retention: Retention{KeepRunningRelease: true, CheckMinutes: 10},
		Pull:      Pull{PullSecret: "/var/lib/kubelet/config.json"},
	}
}

// ErrConfig marks a config that cannot be used.
var ErrConfig = errors.New("bad config")

// LoadConfig reads path over the defaults. A missing file is an error only
// when explicit is true (the user named it).
func LoadConfig(path string, explicit bool) (Config, error) {
	c := DefaultConfig()
	md, err := toml.DecodeFile(path, &c)
	if errors.Is(err, os.ErrNotExist) && !explicit {
		return c, c.Validate()
	}
	if err != nil {
		return c, fmt.Errorf("%w: %s: %v", ErrConfig, path, err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		keys := make([]string, len(und))
		for i, k := range und {
			keys[i] = k.String()
		}
		sort.Strings(keys)
		return c, fmt.Errorf("%w: %s: unknown key %s", ErrConfig, path, strings.Join(keys, ", "))
	}
	if err := c.Validate(); err != nil {
		return c, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// Validate checks values that decode but make no sense.
func (c *Config) Validate() error {
	bad := func(key, format string, a ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrConfig, key, fmt.Sprintf(format, a...))
	}
	if c.NodeName == "" {
		return bad("node_name", "empty and no hostname to default to")
	}
	if !slices.Contains(bundle.Arches, c.Arch) {
		return bad("arch", "%q is not one of %s", c.Arch, strings.Join(bundle.Arches, ", "))
	}
	for i, d := range c.ApprovedDigests {
		if bundle.NormalizeDigest(d) == "" {
			return bad("approved_digests", "entry %d %q is not a sha256 digest (64 hex digits, optional sha256: prefix)", i, d)
		}
	}
	if _, err := machine.ParseApprovalMode(string(c.Approval)); err != nil {
		return bad("approval", "%v", err)
	}
	for _, p := range []struct{ key, val string }{
		{"paths.state_dir", c.Paths.StateDir}, {"paths.extract_dir", c.Paths.ExtractDir},
		{"paths.mount_dir", c.Paths.MountDir}, {"paths.socket", c.Paths.Socket},
		{"paths.crio_conf_dir", c.Paths.CRIOConfDir}, {"paths.registries_conf_dir", c.Paths.RegistriesConfDir},
		{"paths.certs_dir", c.Paths.CertsDir}, {"crio.socket", c.CRIO.Socket},
		{"paths.signature_policy", c.Paths.SignaturePolicy}, {"paths.registries_d", c.Paths.RegistriesD},
	} {
		if p.key == "crio.socket" && p.val == "" {
			continue
		}
		if !strings.HasPrefix(p.val, "/") {
			return bad(p.key, "%q must be an absolute path", p.val)
		}
	}
	switch c.CRIO.Reload {
	case "systemd", "signal", "none":
	default:
		return bad("crio.reload", "%q is not systemd, signal or none", c.CRIO.Reload)
	}
	if c.CRIO.PullWorkers < 0 || c.CRIO.PullWorkers > 64 {
		return bad("crio.pull_workers", "%d is not between 0 (auto) and 64", c.CRIO.PullWorkers)
	}
	if c.CRIO.StorageFloorBytes < 0 {
		return bad("crio.storage_floor_bytes", "negative")
	}
	if c.Registry.Port < 0 || c.Registry.Port > 65535 {
		return bad("registry.port", "%d is not a port", c.Registry.Port)
	}
	switch c.Cluster.Schedule {
	case "Automatic", "Manual":
	default:
		return bad("cluster.schedule", "%q is not Automatic or Manual", c.Cluster.Schedule)
	}
	if c.Peer.Identity == "" && c.Cluster.Kubeconfig != "" && clientCertKubeconfig(c.Cluster.Kubeconfig) {
		// A node's own credential: nothing binds a peer to a node but
		// its certificate, so that is how peers know each other.
		c.Peer.Identity = PeerIdentityNode
		c.Peer.identityDefaulted = true
	}
	if err := c.Peer.validate(c.Cluster); err != nil {
		return err
	}
	if _, ok := pacing.LimitsFor(c.Pacing.Politeness); !ok {
		return bad("pacing.politeness", "%q is not one of %s", c.Pacing.Politeness, strings.Join(pacing.Politeness(), ", "))
	}
	if w := c.Pacing.Watch; w != "" && !filepath.IsAbs(w) {
		return bad("pacing.watch", "%q is not an absolute path: leave it empty (the pods' cgroup, else the node) or name /proc/pressure or a cgroup v2 directory", w)
	}
	if c.Retention.CheckMinutes < 0 {
		return bad("retention.check_minutes", "%d is negative: 0 checks only when CRI-O restarts", c.Retention.CheckMinutes)
	}
	if c.Pull.RateLimit != "" {
		if n, err := bundle.ParseSize(c.Pull.RateLimit); err != nil || n <= 0 {
			return bad("pull.rate_limit", "%q is not a size per second (e.g. 2MiB); leave it empty for no limit", c.Pull.RateLimit)
		}
	}
	if _, err := pullspec.ParseWindow(c.Pull.Window); err != nil {
		return bad("pull.window", "%v", err)
	}
	if p := c.Pull.PullSecret; p != "" && !filepath.IsAbs(p) {
		return bad("pull.pull_secret", "%q must be an absolute path", p)
	}
	switch c.Media.Detect {
	case "automatic", "manual":
	default:
		return bad("media.detect", "%q is not automatic or manual", c.Media.Detect)
	}
	for _, k := range c.Media.AllowDevices {
		if !slices.Contains(DeviceKinds, k) {
			return bad("media.allow_devices", "%q is not one of %s", k, strings.Join(DeviceKinds, ", "))
		}
	}
	for _, f := range c.Media.ExtraFilesystems {
		if !slices.Contains(StickFilesystems, f) {
			return bad("media.extra_filesystems", "%q is not one of %s (vfat, exfat and iso9660 are always read)", f, strings.Join(StickFilesystems, ", "))
		}
	}
	return nil
}

// validate checks peer.identity and the keys that go with it.
func (p Peer) validate(cl Cluster) error {
	bad := func(key, format string, a ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrConfig, key, fmt.Sprintf(format, a...))
	}
	switch p.Identity {
	case "", PeerIdentityToken:
		for k, v := range map[string]string{"peer.cert": p.Cert, "peer.key": p.Key, "peer.client_ca": p.ClientCA, "peer.serving_ca": p.ServingCA} {
			if v != "" {
				return bad(k, "set, but peer.identity is not \"node\": it is read only with peer.identity = \"node\"")
			}
		}
		return nil
	case PeerIdentityNode:
	default:
		return bad("peer.identity", "%q is not token or node", p.Identity)
	}
	// One way in only: a token beside node identities would let
	// whoever holds the token in without a node's certificate.
	why := ""
	if p.identityDefaulted {
		why = " (the default with cluster.kubeconfig a client certificate's, as the kubelet's is)"
	}
	if p.TokenFile != "" {
		return bad("peer.token_file", "set with peer.identity = \"node\"%s: the peers authenticate with their kubelet certificates; remove token_file (and the token file) or set identity = \"token\" (registry mode then does not run)", why)
	}
	if p.Open {
		return bad("peer.open", "set with peer.identity = \"node\"%s: a node serves only nodes of the cluster; remove open or set identity = \"token\"", why)
	}
	if cl.Kubeconfig == "" {
		return bad("peer.identity", "\"node\" needs cluster.kubeconfig (the kubelet's, /var/lib/kubelet/kubeconfig): its client certificate is this node's peer identity")
	}
	for k, v := range map[string]string{"peer.cert": p.Cert, "peer.key": p.Key, "peer.client_ca": p.ClientCA, "peer.serving_ca": p.ServingCA} {
		if v != "" && !filepath.IsAbs(v) {
			return bad(k, "%q must be an absolute path", v)
		}
	}
	return nil
}

// clientCertKubeconfig reports whether the kubeconfig at path
// authenticates its current context with a client certificate (the
// kubelet's does). One that cannot be read is left to the client to
// report.
func clientCertKubeconfig(path string) bool {
	b, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	var kc struct {
		CurrentContext string `yaml:"current-context"`
		Contexts       []struct {
			Name    string `yaml:"name"`
			Context struct {
				User string `yaml:"user"`
			} `yaml:"context"`
		} `yaml:"contexts"`
		Users []struct {
			Name string `yaml:"name"`
			User struct {
				ClientCertificate     string `yaml:"client-certificate"`
				ClientCertificateData string `yaml:"client-certificate-data"`
			} `yaml:"user"`
		} `yaml:"users"`
	}
	if yaml.Unmarshal(b, &kc) != nil {
		return false
	}
	for _, c := range kc.Contexts {
		if c.Name != kc.CurrentContext {
			continue
		}
		for _, u := range kc.Users {
			if u.Name == c.Context.User {
				return u.User.ClientCertificate != "" || u.User.ClientCertificateData != ""
			}
		}
	}
	return false
}

// WriteConfig prints c as TOML (the effective config).
func WriteConfig(w io.Writer, c Config) error {
	return toml.NewEncoder(w).Encode(c)
}

// settingsOf is what of c the machine decides with.
func settingsOf(c Config) machine.Settings {
	return machine.Settings{
		NodeName: c.NodeName, ApprovalOff: c.ApprovalOff(),
		OnReady: c.Cluster.OnReady, Schedule: c.Cluster.Schedule,
		ExtractDir: cleanDir(c.Paths.ExtractDir), StateDir: cleanDir(c.Paths.StateDir),
		KeepRunningRelease: c.Retention.KeepRunningRelease,
		Peers:              c.Peer.Peers, PeersClosed: c.Peer.Closed(),
	}
}

// cleanDir is dir as the machine joins it, by hand: clean, "" left "".
func cleanDir(dir string) string {
	if dir == "" {
		return ""
	}
	return filepath.Clean(dir)
}
