package vm

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// The VM tests need root, qemu, mmdebstrap (first run), apt access (first
// run) and a CRI-O build. With CI=true a missing piece fails the test;
// otherwise it skips with what to run.
//
// Environment:
//
//	FERRY_CRIO_DIR   directory with crio, crictl, pinns (default: test/setup/build-crio.sh)
//	FERRY_VM_ACCEL   kvm|tcg, skips the KVM probe
//	FERRY_VM_IMAGES  images in the test bundle (default 30)
//	FERRY_VM_KEEP    keep each guest's logs in this directory
//	FERRY_VM_FERRY   a ferry binary to test instead of building ./cmd/ferry
//	FERRY_VM_LOAD_TIMEOUT  bound on one bundle's load (default 15m)
//	FERRY_VM_IMAGE_KIB     size of each image's own layer (default 1024)
//	FERRY_VM_FLOOR   1: the three-node test also measures the floor of
//	                 three guests reading and pulling raw at once (3+ min
//	                 under TCG; a benchmark figure, so off in CI)

var shared struct {
	once  sync.Once
	err   error
	skip  string
	img   *Image
	accel string
	why   string
	bins  *Binaries
	tmp   string
	setup time.Duration
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.tmp != "" {
		os.RemoveAll(shared.tmp)
	}
	os.Exit(code)
}

func inCI() bool { return os.Getenv("CI") == "true" }

// need fails the test under CI and skips it elsewhere.
func need(t *testing.T, format string, a ...any) {
	t.Helper()
	if inCI() {
		t.Fatalf("CI=true and the VM tests cannot run: "+format, a...)
	}
	t.Skipf("skipping VM test: "+format, a...)
}

type env struct {
	img   *Image
	accel string
	bins  *Binaries
	log   *slog.Logger
}

func (e *env) why() string { return shared.why }

// setup returns the shared image, accelerator and binaries, building them
// on first use.
func setup(t *testing.T) *env {
	t.Helper()
	if testing.Short() {
		t.Skip("VM tests are not short")
	}
	if os.Geteuid() != 0 {
		need(t, "must run as root (qemu, mounts, mkfs)")
	}
	for _, c := range []string{"qemu-system-x86_64", "mmdebstrap", "mkfs.ext4", "mkfs.vfat", "mcopy", "genisoimage", "cpio", "depmod", "xz"} {
		if _, err := exec.LookPath(c); err != nil {
			need(t, "%s not installed: run test/setup/setup-vm-host.sh", c)
		}
	}
	shared.once.Do(func() {
		start := time.Now()
		log := slog.New(slog.NewTextHandler(os.Stderr, nil))
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		defer cancel()
		crioDir, err := crioDir(ctx)
		if err != nil {
			shared.err = err
			return
		}
		shared.tmp, err = os.MkdirTemp("", "ferry-vm-bin-")
		if err != nil {
			shared.err = err
			return
		}
		var wg sync.WaitGroup
		var binErr error
		wg.Go(func() { shared.bins, binErr = BuildBinaries(ctx, shared.tmp) })
		shared.img, err = BuildImage(ctx, ImageConfig{CRIODir: crioDir, Log: log})
		if err != nil {
			shared.err = err
			wg.Wait()
			return
		}
		shared.accel, shared.why = ProbeAccelCached(ctx, DefaultCacheDir(), shared.img.Kernel, 10*time.Second)
		wg.Wait()
		if binErr != nil {
			shared.err = binErr
			return
		}
		shared.setup = time.Since(start)
		fmt.Fprintf(os.Stderr, "vm: image ready, accel=%s (%s), ferry unit from %s, setup %.1fs\n",
			shared.accel, shared.why, shared.bins.UnitFrom, shared.setup.Seconds())
	})
	if shared.err != nil {
		t.Fatalf("VM test setup: %v", shared.err)
	}
	return &env{img: shared.img, accel: shared.accel, bins: shared.bins,
		log: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))}
}

func crioDir(ctx context.Context) (string, error) {
	if d := os.Getenv("FERRY_CRIO_DIR"); d != "" {
		return d, nil
	}
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(root, "test/setup/build-crio.sh"))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%w: test/setup/build-crio.sh: %v", ErrHostSetup, err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1], nil
}

// boot starts one guest for the test; the guest is killed when the test
// ends, and its logs are kept under FERRY_VM_KEEP.
func (e *env) boot(t *testing.T, ctx context.Context, name string, node Node, cpus int, net *NetConfig) *VM {
	t.Helper()
	return e.bootWith(t, ctx, node, Config{Name: name, CPUs: cpus, Net: net})
}

// bootWith is boot with the rest of the guest's Config (its API
// forward, say); the image, accelerator, layer and log are the env's.
func (e *env) bootWith(t *testing.T, ctx context.Context, node Node, cfg Config) *VM {
	t.Helper()
	layer, err := node.Layer(e.bins)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Dir = t.TempDir()
	if keep := os.Getenv("FERRY_VM_KEEP"); keep != "" {
		cfg.Dir = filepath.Join(keep, strings.ReplaceAll(t.Name(), "/", "_"), cfg.Name)
		os.RemoveAll(cfg.Dir)
	}
	cfg.Image, cfg.Accel, cfg.Layer, cfg.Log = e.img, e.accel, layer, e.log
	v, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(v.Kill)
	return v
}

func (e *env) waitReady(t *testing.T, ctx context.Context, v *VM) BootInfo {
	t.Helper()
	bctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	b, err := v.WaitReady(bctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: booted in %.1fs (guest uptime %.1fs, control channel after %.1fs), system %s",
		v.Name(), b.HostSeconds, b.GuestUptime, b.AgentSeconds, b.SystemState)
	logFailedUnits(t, ctx, v, b)
	return b
}

// sh runs a guest command that must succeed and returns its stdout.
func sh(t *testing.T, ctx context.Context, v *VM, cmd string) string {
	t.Helper()
	r, err := v.Run(ctx, cmd)
	if err != nil {
		t.Fatal(err)
	}
	if r.Code != 0 {
		t.Fatalf("%s: %q exited %d: %s%s", v.Name(), cmd, r.Code, r.Stdout, r.Stderr)
	}
	return r.Stdout
}

// try runs a guest command and returns its result whatever the exit code.
func try(t *testing.T, ctx context.Context, v *VM, cmd string) Result {
	t.Helper()
	r, err := v.Run(ctx, cmd)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// crictlImage is one entry of `crictl images -o json`.
type crictlImage struct {
	ID          string   `json:"id"`
	RepoTags    []string `json:"repoTags"`
	RepoDigests []string `json:"repoDigests"`
	Size        string   `json:"size"`
	Pinned      bool     `json:"pinned"`
}

const crictl = "crictl --runtime-endpoint unix:///var/run/crio/crio.sock"

func guestImages(t *testing.T, ctx context.Context, v *VM) []crictlImage {
	t.Helper()
	out := sh(t, ctx, v, crictl+" images -o json")
	var r struct {
		Images []crictlImage `json:"images"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("crictl images -o json: %v\n%s", err, out)
	}
	return r.Images
}

// logFailedUnits says which units failed when the guest booted degraded.
func logFailedUnits(t *testing.T, ctx context.Context, v *VM, b BootInfo) {
	t.Helper()
	if b.SystemState == "running" {
		return
	}
	r, err := v.Run(ctx, "systemctl --failed --no-legend --no-pager; for u in $(systemctl --failed --no-legend --plain | cut -d' ' -f1); do journalctl -u $u -b --no-pager -n 15 -o cat; done")
	if err == nil {
		t.Logf("%s: failed units:\n%s", v.Name(), r.Stdout)
	}
}
