// Package crioenv runs a real CRI-O 1.34 by hand (no systemd) for tests,
// everything under one temporary root, reloaded by SIGHUP through its pid
// file. It needs root and the binaries test/setup/build-crio.sh caches
// (FERRY_CRIO_DIR overrides the place); with CI=true a missing piece fails
// the test, elsewhere it skips it.
package crioenv

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/crio"
)

const crioVersion = "v1.34.0"

// Need skips the test (or fails it under CI) when something is missing.
func Need(t testing.TB, ok bool, format string, a ...any) {
	t.Helper()
	if ok {
		return
	}
	msg := fmt.Sprintf(format, a...)
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI: %s", msg)
	}
	t.Skipf("skipped: %s", msg)
}

func crioBinDir(t testing.TB) string {
	t.Helper()
	Need(t, os.Geteuid() == 0, "needs root (CRI-O's storage and mounts)")
	dir := os.Getenv("FERRY_CRIO_DIR")
	if dir == "" {
		cache := os.Getenv("FERRY_CACHE")
		if cache == "" {
			cache = "/var/cache/ferry-test"
		}
		dir = filepath.Join(cache, "crio-"+crioVersion)
	}
	_, err := os.Stat(filepath.Join(dir, "crio"))
	Need(t, err == nil, "no CRI-O binary in %s: run bash test/setup/build-crio.sh", dir)
	for _, p := range []string{"/usr/bin/conmon", "/usr/sbin/runc", "/etc/containers/policy.json"} {
		_, err := os.Stat(p)
		Need(t, err == nil, "%s missing: run bash test/setup/install-deps.sh", p)
	}
	return dir
}

// CRIO is a CRI-O process with everything under one temporary directory:
// its storage, socket, crio.conf.d, registries.conf(.d), its signature
// policy (Policy, a copy of the host's until a test writes another), and
// certs.d and registries.d (as $HOME/.config/containers/certs.d and
// registries.d, which containers/image uses instead of /etc/containers').
type CRIO struct {
	t       testing.TB
	bin     string
	Root    string
	Storage string // the image store; "" for Root/storage
	Socket  string
	PidFile string
	Dropins *crio.Dropins
	LogFile string
	Policy  string // policy.json, read by CRI-O on every pull
	prefix  []string

	mu  sync.Mutex
	cmd *exec.Cmd
}

// Start starts CRI-O for the test and stops it at cleanup.
func Start(t testing.TB) *CRIO {
	t.Helper()
	return StartIn(t, nil)
}

// StartIn is Start with CRI-O's command prefixed by prefix, e.g. nsenter
// --net=/run/netns/NAME: the prefix must exec CRI-O in place, so that the
// pid is CRI-O's own (the pid file reloads it).
func StartIn(t testing.TB, prefix []string) *CRIO {
	t.Helper()
	return start(t, prefix, "")
}

// StartOn is Start with CRI-O's image store in storage (a filesystem the
// test made, e.g. a small loop mount).
func StartOn(t testing.TB, storage string) *CRIO {
	t.Helper()
	return start(t, nil, storage)
}

func start(t testing.TB, prefix []string, storage string) *CRIO {
	t.Helper()
	bin := crioBinDir(t)
	// Short paths: the socket path must fit in sun_path.
	root, err := os.MkdirTemp("", "ferry-crio-")
	if err != nil {
		t.Fatal(err)
	}
	c := &CRIO{
		t: t, bin: bin, Root: root, prefix: prefix, Storage: storage,
		Socket:  filepath.Join(root, "run", "crio.sock"),
		PidFile: filepath.Join(root, "run", "crio.pid"),
		LogFile: filepath.Join(root, "crio.log"),
		Policy:  filepath.Join(root, "etc", "containers", "policy.json"),
		Dropins: &crio.Dropins{
			CRIOConfDir:       filepath.Join(root, "etc", "crio", "crio.conf.d"),
			RegistriesConfDir: filepath.Join(root, "etc", "containers", "registries.conf.d"),
			CertsDir:          filepath.Join(root, "home", ".config", "containers", "certs.d"),
			RegistriesD:       filepath.Join(root, "home", ".config", "containers", "registries.d"),
		},
	}
	for _, d := range []string{c.Dropins.CRIOConfDir, c.Dropins.RegistriesConfDir, c.Dropins.CertsDir, c.Dropins.RegistriesD,
		filepath.Join(root, "run"), filepath.Join(root, "lib"), filepath.Join(root, "tmp"), filepath.Join(root, "cni")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	Write(t, filepath.Join(root, "etc", "crio", "crio.conf"), c.config())
	Write(t, filepath.Join(root, "etc", "containers", "registries.conf"), "unqualified-search-registries = []\n")
	hostPolicy, err := os.ReadFile("/etc/containers/policy.json")
	if err != nil {
		t.Fatal(err)
	}
	Write(t, c.Policy, string(hostPolicy))
	t.Cleanup(c.cleanup)
	c.Start(t)
	return c
}

func (c *CRIO) storageDir() string {
	if c.Storage != "" {
		return c.Storage
	}
	return filepath.Join(c.Root, "storage")
}

func (c *CRIO) config() string {
	r := c.Root
	return fmt.Sprintf(`[crio]
root = "%[3]s"
runroot = "%[1]s/run/storage"
storage_driver = "overlay"
log_dir = "%[1]s/run/pods-logs"
version_file = "%[1]s/run/version"
version_file_persist = "%[1]s/lib/version"
clean_shutdown_file = "%[1]s/lib/clean.shutdown"

[crio.api]
listen = "%[1]s/run/crio.sock"
stream_address = "127.0.0.1"
stream_port = "0"

[crio.runtime]
cgroup_manager = "cgroupfs"
conmon_cgroup = "pod"
default_runtime = "runc"
namespaces_dir = "%[1]s/run/ns"
pinns_path = "%[2]s/pinns"
container_exits_dir = "%[1]s/run/exits"
container_attach_socket_dir = "%[1]s/run/attach"
hooks_dir = []
log_level = "info"

[crio.runtime.runtimes.runc]
runtime_path = "/usr/sbin/runc"
runtime_root = "%[1]s/run/runc"
monitor_path = "/usr/bin/conmon"

[crio.image]
signature_policy = "%[1]s/etc/containers/policy.json"
pause_image = "quay.io/ferry-test/pause:none"
big_files_temporary_dir = "%[1]s/tmp"

[crio.network]
network_dir = "%[1]s/cni"
plugin_dirs = ["/usr/lib/cni"]

[crio.nri]
enable_nri = false

[crio.metrics]
enable_metrics = false
`, r, c.bin, c.storageDir())
}

// Start starts CRI-O and waits until it answers on its socket.
func (c *CRIO) Start(t testing.TB) {
	t.Helper()
	logf, err := os.OpenFile(c.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	argv := append(append([]string{}, c.prefix...), filepath.Join(c.bin, "crio"),
		"--config", filepath.Join(c.Root, "etc", "crio", "crio.conf"),
		"--config-dir", c.Dropins.CRIOConfDir,
		"--registries-conf", filepath.Join(c.Root, "etc", "containers", "registries.conf"),
		"--registries-conf-dir", c.Dropins.RegistriesConfDir,
	)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), "HOME="+filepath.Join(c.Root, "home"))
	cmd.Stdout, cmd.Stderr = logf, logf
	// One log holds every start: mark where this one begins.
	fmt.Fprintf(logf, "--- crioenv: start at %s ---\n", time.Now().Format(time.RFC3339Nano))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatal(err)
	}
	logf.Close()
	Write(t, c.PidFile, fmt.Sprintln(cmd.Process.Pid))
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	c.mu.Lock()
	c.cmd = cmd
	c.mu.Unlock()

	cl := c.Client(t)
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := cl.Version(ctx)
		cancel()
		if err == nil {
			return
		}
		select {
		case <-exited:
			t.Fatalf("crio exited at start (%v):\n%s", waitErr, c.LogTail(40))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("crio not answering after 60s: %v\n%s", err, c.LogTail(40))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Kill stops CRI-O with SIGKILL, as a crash would, and waits for it.
func (c *CRIO) Kill(t testing.TB) {
	t.Helper()
	c.stop(syscall.SIGKILL)
}

// LoseStorage kills CRI-O, as an unclean stop would, and removes its
// image store, as CRI-O's repair after an unclean stop may: it comes back
// empty at the next Start.
func (c *CRIO) LoseStorage(t testing.TB) {
	t.Helper()
	c.Kill(t)
	store := c.storageDir()
	c.unmountUnder(store)
	if err := os.RemoveAll(store); err != nil {
		t.Fatalf("removing CRI-O's storage: %v", err)
	}
}

func (c *CRIO) stop(sig syscall.Signal) {
	c.mu.Lock()
	cmd := c.cmd
	c.cmd = nil
	c.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(sig)
	deadline := time.Now().Add(30 * time.Second)
	for cmd.Process.Signal(syscall.Signal(0)) == nil && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	cmd.Process.Kill()
	os.Remove(c.PidFile)
}

func (c *CRIO) cleanup() {
	c.stop(syscall.SIGTERM)
	if c.t.Failed() {
		c.t.Logf("crio log tail:\n%s", c.LogTail(60))
	}
	// Mounts containers/storage may have left under the root.
	c.unmountUnder(c.Root)
	if c.Storage != "" {
		c.unmountUnder(c.Storage + "/")
	}
	if os.Getenv("FERRY_KEEP_CRIO") == "" {
		os.RemoveAll(c.Root)
	}
}

// unmountUnder detaches every mount whose mount point starts with prefix,
// deepest first.
func (c *CRIO) unmountUnder(prefix string) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var mps []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) > 4 && strings.HasPrefix(f[4], prefix) {
			mps = append(mps, f[4])
		}
	}
	for i := len(mps) - 1; i >= 0; i-- {
		syscall.Unmount(mps[i], syscall.MNT_DETACH)
	}
}

// Client is a CRI client on this CRI-O's socket, closed at cleanup.
func (c *CRIO) Client(t testing.TB) *crio.Client {
	t.Helper()
	cl, err := crio.Dial(c.Socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

// Reloader reloads this CRI-O with SIGHUP through its pid file.
func (c *CRIO) Reloader() crio.Reloader { return crio.SignalReloader{PidFile: c.PidFile} }

// LogTail is the end of CRI-O's log.
func (c *CRIO) LogTail(lines int) string {
	b, _ := os.ReadFile(c.LogFile)
	l := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}

func Write(t testing.TB, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// Configure points an agent's config at this CRI-O: its socket, SIGHUP
// reload through its pid file, its storage and its drop-in dirs.
func (c *CRIO) Configure(cfg *agent.Config) {
	cfg.CRIO.Socket = c.Socket
	cfg.CRIO.Reload = "signal"
	cfg.CRIO.PidFile = c.PidFile
	cfg.CRIO.StorageDir = c.storageDir()
	cfg.CRIO.StorageFloorBytes = 1 << 20
	cfg.Paths.CRIOConfDir = c.Dropins.CRIOConfDir
	cfg.Paths.RegistriesConfDir = c.Dropins.RegistriesConfDir
	cfg.Paths.CertsDir = c.Dropins.CertsDir
	cfg.Paths.SignaturePolicy = c.Policy
	cfg.Paths.RegistriesD = c.Dropins.RegistriesD
}

// RequireSigstore makes this CRI-O's policy what an OpenShift 4.21+ node's
// is (the MCO's rendering of the default openshift ClusterImagePolicy): a
// sigstore signature by the key pub (PEM) for repo, matchRepository,
// anything else accepted; and a registries.d file turning sigstore
// attachments on for repo, as the MCO writes it.
func (c *CRIO) RequireSigstore(t testing.TB, repo string, pub []byte) {
	t.Helper()
	key := filepath.Join(c.Root, "etc", "containers", "release.pub")
	Write(t, key, string(pub))
	Write(t, c.Policy, fmt.Sprintf(`{"default":[{"type":"insecureAcceptAnything"}],"transports":{"docker":{
  %q:[{"type":"sigstoreSigned","keyPath":%q,"signedIdentity":{"type":"matchRepository"}}]}}}
`, repo, key))
	Write(t, filepath.Join(c.Dropins.RegistriesD, "sigstore-registries.yaml"),
		fmt.Sprintf("docker:\n  %s:\n    use-sigstore-attachments: true\n", repo))
}

// PullAll pulls refs through cl with that many concurrent CRI pulls, as
// the benchmarks' floor does, and returns how long it took; the error is
// the first pull's that failed.
func PullAll(ctx context.Context, cl *crio.Client, refs []string, workers int) (time.Duration, error) {
	start := time.Now()
	jobs := make(chan string)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range jobs {
				if _, err := cl.Pull(ctx, r); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	for _, r := range refs {
		jobs <- r
	}
	close(jobs)
	wg.Wait()
	return time.Since(start), firstErr
}
