package localapi

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"aead.dev/minisign"
	"golang.org/x/sys/unix"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/bundle/bundletest"
	"github.com/ferry-edge/ferry/pull"
)

// fakeAgent is the agent behind the socket: it takes a bundle by reading
// it through the files passed, as the agent's extraction does, and keeps
// every request it was asked.
type fakeAgent struct {
	mu       sync.Mutex
	requests []string
	read     []readBundle
	refuse   error // what Request answers, when set
	pulls    []pull.Request
}

// readBundle is what the fake read through one passed bundle's files.
type readBundle struct {
	label, tarDigest, sha256File string
	sig                          bool
}

func (f *fakeAgent) Status() agent.Status {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := agent.Status{Node: "node-a", Phase: "idle", Reason: agent.ReasonWaitingForStick}
	if n := len(f.read); n > 0 {
		s.Phase, s.Reason, s.Bundle = string(agent.PhaseDetected), agent.ReasonVerifying, filepath.Base(f.read[n-1].label)
	}
	return s
}

func (f *fakeAgent) Pull(req pull.Request) error {
	if err := pull.Check(req); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pulls = append(f.pulls, req)
	return nil
}

func (f *fakeAgent) Cluster() agent.ClusterStatus {
	return agent.ClusterStatus{Peers: map[string]agent.ClusterNode{"node-b": {Unreachable: "no route"}}}
}

func (f *fakeAgent) Request(_ context.Context, kind string, m agent.Medium) error {
	var got []readBundle
	if m != nil {
		defer m.Close()
		for _, src := range m.Bundles() {
			rb := readBundle{label: src.Label, sig: src.SigPath != ""}
			b, err := os.ReadFile(src.Path)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(b)
			rb.tarDigest = "sha256:" + hex.EncodeToString(sum[:])
			if src.SHA256Path != "" {
				s, err := os.ReadFile(src.SHA256Path)
				if err != nil {
					return err
				}
				rb.sha256File = string(s)
			}
			got = append(got, rb)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.refuse != nil {
		return f.refuse
	}
	f.requests = append(f.requests, kind)
	f.read = append(f.read, got...)
	return nil
}

func (f *fakeAgent) bundlesRead() []readBundle {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]readBundle(nil), f.read...)
}

func (f *fakeAgent) refuseWith(err error) {
	f.mu.Lock()
	f.refuse = err
	f.mu.Unlock()
}

func (f *fakeAgent) asked() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.requests...)
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// serve runs the local API of a fake agent on a socket in a new dir.
func serve(t *testing.T) (*fakeAgent, *Client, string) {
	return serveAt(t, filepath.Join(t.TempDir(), "ferry.sock"))
}

// serveAt is serve with the socket at sock.
func serveAt(t *testing.T, sock string) (*fakeAgent, *Client, string) {
	a := &fakeAgent{}
	go Serve(t.Context(), sock, a, nil)
	c := NewClient(sock)
	for range 200 {
		if _, err := c.Status(t.Context()); err == nil {
			return a, c, sock
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("the status socket does not answer")
	return nil, nil, ""
}

func TestStatusAPI_OverUnixSocket(t *testing.T) {
	a, c, sock := serve(t)
	s, err := c.Status(t.Context())
	must(t, err)
	if s.Node != "node-a" || s.Phase != "idle" {
		t.Fatalf("%+v", s)
	}
	fi, err := os.Stat(sock)
	must(t, err)
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v", fi.Mode().Perm())
	}
	cs, err := c.Cluster(t.Context())
	if err != nil || cs.Peers["node-b"].Unreachable != "no route" {
		t.Fatalf("cluster %+v, %v", cs, err)
	}
	p, _ := bundletest.Write(t, t.TempDir(), bundletest.Options{})
	_, err = c.Load(t.Context(), p)
	must(t, err)
	_, err = c.Do(t.Context(), "cleanup")
	must(t, err)
	if got := strings.Join(a.asked(), ","); got != "load,cleanup" {
		t.Fatalf("the agent was asked %q, want load,cleanup", got)
	}
	a.refuseWith(errors.New("nothing to proceed with"))
	if _, err := c.Do(t.Context(), "proceed"); err == nil || err.Error() != "nothing to proceed with" {
		t.Fatalf("a refused request: %v", err)
	}
	if _, err := NewClient(filepath.Join(t.TempDir(), "none.sock")).Status(t.Context()); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("no agent: %v", err)
	}
}

// ferry load --release: the request reaches the agent whole (release and
// every extra image); one that names no digest is refused with the reason.
func TestPull_TheRequestReachesTheAgentWhole(t *testing.T) {
	a, c, _ := serve(t)
	want := pull.Request{Release: "quay.io/openshift-release-dev/ocp-release@sha256:" + strings.Repeat("a", 64),
		Extras: []string{"quay.io/my/app:v1", "quay.io/my/db@sha256:" + strings.Repeat("b", 64)}}
	_, err := c.Pull(t.Context(), want)
	must(t, err)
	a.mu.Lock()
	got := slices.Clone(a.pulls)
	a.mu.Unlock()
	if len(got) != 1 || got[0].Release != want.Release || !slices.Equal(got[0].Extras, want.Extras) {
		t.Fatalf("the agent got %+v, want %+v", got, want)
	}
	if _, err := c.Pull(t.Context(), pull.Request{Release: "quay.io/openshift-release-dev/ocp-release:4.13.7"}); err == nil || !strings.Contains(err.Error(), "by digest") {
		t.Fatalf("a release by tag: %v", err)
	}
}

// ferry load passes open files: the agent reads the bundle through them,
// so a file it could not open by its path (here: gone from every
// directory once the caller opened it, as /root is to a ProtectHome unit)
// is read whole, with its .sha256, and named as the caller named it.
func TestLoad_TheAgentReadsThePassedFilesNotThePath(t *testing.T) {
	a, c, _ := serve(t)
	dir := t.TempDir()
	tarPath, digest := bundletest.Write(t, dir, bundletest.Options{})
	p, err := OpenBundle(tarPath)
	must(t, err)
	defer p.Close()
	if p.SHA256 == nil {
		t.Fatal("the .sha256 beside the tar was not opened")
	}
	must(t, os.RemoveAll(dir))
	s, err := c.pass(t.Context(), p)
	must(t, err)
	if s.Bundle != "upgrade-4.13.7-x86_64.tar" || s.Reason != agent.ReasonVerifying {
		t.Errorf("status names %q (%s), not the bundle", s.Bundle, s.Reason)
	}
	read := a.bundlesRead()
	if len(read) != 1 {
		t.Fatalf("the agent read %d bundles, want 1", len(read))
	}
	got := read[0]
	if got.tarDigest != string(digest) || !strings.Contains(got.sha256File, digest.Encoded()) {
		t.Fatalf("read through the passed files: tar %s, .sha256 %q; want %s", got.tarDigest, got.sha256File, digest)
	}
	if got.label != tarPath {
		t.Errorf("the bundle is named %q, want the caller's %q", got.label, tarPath)
	}
}

// ferry load runs as root, perhaps in a directory another user can
// write: a sidecar that is a symbolic link (to a file only root may read,
// which the agent would keep and offer to its peers) or a FIFO is refused,
// and so is a .minisig that is no signature; nothing reaches the agent.
// A real signature beside the tar is passed.
func TestLoad_ASidecarThatIsALinkOrNoSignatureIsRefused(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "secret")
	must(t, os.WriteFile(secret, []byte("root's secret\n"), 0o600))
	_, priv, err := minisign.GenerateKey(nil)
	must(t, err)
	for _, tc := range []struct {
		name string
		make func(t *testing.T, tarPath string) // puts the sidecar beside the tar
		want string                             // "" passed, else in the error
	}{
		{"a .minisig linked to a secret", func(t *testing.T, tarPath string) {
			must(t, os.Symlink(secret, tarPath+".minisig"))
		}, "it is a symbolic link"},
		{"a .sha256 linked to a secret", func(t *testing.T, tarPath string) {
			sha := strings.TrimSuffix(tarPath, ".tar") + ".sha256"
			must(t, os.Remove(sha))
			must(t, os.Symlink(secret, sha))
		}, "it is a symbolic link"},
		{"a dangling .minisig link", func(t *testing.T, tarPath string) {
			must(t, os.Symlink(filepath.Join(t.TempDir(), "gone"), tarPath+".minisig"))
		}, "it is a symbolic link"},
		{"a .minisig FIFO", func(t *testing.T, tarPath string) {
			must(t, unix.Mkfifo(tarPath+".minisig", 0o600))
		}, "it is a FIFO"},
		{"a .minisig that is no signature", func(t *testing.T, tarPath string) {
			must(t, os.WriteFile(tarPath+".minisig", []byte("root's secret\n"), 0o644))
		}, "is not a minisign signature"},
		{"a signature", func(t *testing.T, tarPath string) {
			tb, err := os.ReadFile(tarPath)
			must(t, err)
			sig := minisign.Sign(priv, tb)
			must(t, os.WriteFile(tarPath+".minisig", sig, 0o644))
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, c, _ := serve(t)
			tarPath, _ := bundletest.Write(t, t.TempDir(), bundletest.Options{})
			tc.make(t, tarPath)
			_, err := c.Load(t.Context(), tarPath)
			if tc.want == "" {
				must(t, err)
				if read := a.bundlesRead(); len(read) != 1 || !read[0].sig {
					t.Fatalf("the agent read %+v, want the bundle with its signature", read)
				}
				return
			}
			if !errors.Is(err, bundle.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want a refusal saying %q", err, tc.want)
			}
			t.Log(err)
			if strings.Contains(err.Error(), "root's secret") {
				t.Errorf("the refusal shows the file's bytes: %v", err)
			}
			if got := a.asked(); len(got) != 0 {
				t.Fatalf("the agent was asked %v", got)
			}
		})
	}
}

// A load request that carries no files is refused: the agent opens no
// path a caller names (a path in the query is ignored).
func TestLoad_ARequestWithoutFilesIsRefused(t *testing.T) {
	a, c, _ := serve(t)
	tarPath, _ := bundletest.Write(t, t.TempDir(), bundletest.Options{})
	_, err := raw(t.Context(), c.hc, http.MethodPost, "/v1/load?path="+tarPath)
	if err == nil || !strings.Contains(err.Error(), "ferry load PATH") {
		t.Fatalf("got %v", err)
	}
	if got := a.asked(); len(got) != 0 {
		t.Fatalf("the agent was asked %v for a path", got)
	}
	if _, err := c.Load(t.Context(), filepath.Join(t.TempDir(), "none.tar")); err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a missing file: %v", err)
	}
}

// Every descriptor a load passes is checked before the agent reads or
// reopens it: an O_PATH descriptor grants no read, and reopening it
// through /proc/self/fd would give the caller root's read; a write-only
// one likewise; a FIFO would block, a socket, a directory or a character
// device is no bundle. A regular file, and a block device for the tar
// only, are read.
func TestCheckPassed_RefusesWhatGrantsNoReadOrIsNoFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "upgrade.tar")
	must(t, os.WriteFile(file, []byte("tar bytes"), 0o600))
	fifo := filepath.Join(dir, "fifo")
	must(t, unix.Mkfifo(fifo, 0o600))
	open := func(path string, flags int) func(t *testing.T) *os.File {
		return func(t *testing.T) *os.File {
			fd, err := unix.Open(path, flags|unix.O_CLOEXEC, 0)
			must(t, err)
			return os.NewFile(uintptr(fd), path)
		}
	}
	socket := func(t *testing.T) *os.File {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		must(t, err)
		unix.Close(fds[1])
		return os.NewFile(uintptr(fds[0]), "socket")
	}
	for _, tc := range []struct {
		name string
		open func(t *testing.T) *os.File
		kind string
		want string // "" accepted, else in the error
	}{
		{"a regular file opened for reading is read", open(file, unix.O_RDONLY), "tar", ""},
		{"a regular sidecar is read", open(file, unix.O_RDONLY), "sha256", ""},
		{"a file open for reading and writing is read", open(file, unix.O_RDWR), "tar", ""},
		{"an O_PATH descriptor is refused", open(file, unix.O_PATH), "tar", "O_PATH descriptor, which grants no read"},
		{"an O_PATH sidecar is refused", open(file, unix.O_PATH), "minisig", "O_PATH descriptor"},
		{"a write-only descriptor is refused", open(file, unix.O_WRONLY), "tar", "open for writing only"},
		{"a FIFO is refused", open(fifo, unix.O_RDONLY|unix.O_NONBLOCK), "tar", "is a FIFO"},
		{"a socket is refused", socket, "tar", "is a socket"},
		{"a directory is refused", open(dir, unix.O_RDONLY|unix.O_DIRECTORY), "tar", "is a directory"},
		{"a character device is refused", open("/dev/zero", unix.O_RDONLY), "sha256", "is a character device"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := tc.open(t)
			defer f.Close()
			err := checkPassed(f, tc.kind)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (!errors.Is(err, ErrPassedFile) || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("got %v, want ErrPassedFile saying %q", err, tc.want)
			}
		})
	}
}

// An O_PATH descriptor passed over the real socket (SCM_RIGHTS carries
// them) is refused with its reason, and nothing is read.
func TestLoad_AnOPathDescriptorIsRefused(t *testing.T) {
	a, c, _ := serve(t)
	tarPath, _ := bundletest.Write(t, t.TempDir(), bundletest.Options{})
	fd, err := unix.Open(tarPath, unix.O_PATH|unix.O_CLOEXEC, 0)
	must(t, err)
	p := &PassedBundle{Label: tarPath, Tar: os.NewFile(uintptr(fd), tarPath)}
	defer p.Close()
	_, err = c.pass(t.Context(), p)
	if err == nil || !strings.Contains(err.Error(), "O_PATH") {
		t.Fatalf("an O_PATH tar: %v", err)
	}
	if got := a.asked(); len(got) != 0 {
		t.Fatalf("the agent took an O_PATH descriptor: asked %v", got)
	}
}

// runAsNobody runs test child of this test binary as nobody (uid 65534)
// with env, from a copy of the binary in dir (a tree nobody can reach),
// and returns what it printed.
func runAsNobody(t *testing.T, dir, child, env string) string {
	t.Helper()
	self, err := os.Executable()
	must(t, err)
	bin := filepath.Join(dir, "localapi.test")
	b, err := os.ReadFile(self)
	must(t, err)
	must(t, os.WriteFile(bin, b, 0o755))
	cmd := exec.CommandContext(t.Context(), bin, "-test.run=^"+child+"$", "-test.v")
	cmd.Env = []string{env, "PATH=/usr/bin:/bin"}
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s as nobody: %v\n%s", child, err, out)
	}
	return string(out)
}

// senderEnv names, for the child process of
// TestLoad_ANonRootSenderIsRefusedBySOPeerCred, the socket and the
// bundle it passes.
const senderEnv = "FERRY_TEST_PASSFD_SENDER"

// Only root may pass bundles: the agent checks the peer's credentials
// (SO_PEERCRED), whatever the socket's mode lets connect. Here the socket
// is opened to all and a process running as nobody (uid 65534), able to
// read the bundle, passes it: refused, naming the uid, nothing read.
func TestLoad_ANonRootSenderIsRefusedBySOPeerCred(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, to start a sender as another user")
	}
	// A tree nobody can reach: the socket, the bundle, this test binary.
	dir, err := os.MkdirTemp("", "ferry-passfd-")
	must(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	must(t, os.Chmod(dir, 0o755))
	sock := filepath.Join(dir, "ferry.sock")
	a, _, _ := serveAt(t, sock)
	must(t, os.Chmod(sock, 0o666))
	bdir := filepath.Join(dir, "bundle")
	must(t, os.Mkdir(bdir, 0o755))
	tarPath, _ := bundletest.Write(t, bdir, bundletest.Options{})
	for _, p := range []string{tarPath, strings.TrimSuffix(tarPath, ".tar") + ".sha256"} {
		must(t, os.Chmod(p, 0o644))
	}
	out := runAsNobody(t, dir, "TestLoad_SenderChild", senderEnv+"="+sock+","+tarPath)
	if !strings.Contains(out, "REFUSED: ") || !strings.Contains(out, "refused uid 65534") ||
		!strings.Contains(out, "only root may pass bundles") {
		t.Fatalf("the non-root sender was not refused by its uid:\n%s", out)
	}
	if got := a.asked(); len(got) != 0 {
		t.Fatalf("the agent took a bundle from uid 65534: asked %v", got)
	}
}

// TestLoad_SenderChild is the sending side of
// TestLoad_ANonRootSenderIsRefusedBySOPeerCred, run as nobody; it does
// nothing in a plain test run.
func TestLoad_SenderChild(t *testing.T) {
	sock, tarPath, ok := strings.Cut(os.Getenv(senderEnv), ",")
	if !ok {
		t.Skip("the sending side of TestLoad_ANonRootSenderIsRefusedBySOPeerCred")
	}
	if os.Geteuid() == 0 {
		t.Fatal("the sender runs as root")
	}
	p, err := OpenBundle(tarPath)
	must(t, err)
	defer p.Close()
	if _, err := NewClient(sock).pass(t.Context(), p); err != nil {
		fmt.Printf("REFUSED: %v\n", err)
		return
	}
	t.Fatal("the agent accepted the bundle")
}

// statusCallerEnv names, for the child process of
// TestStatus_ANonRootCallerIsToldToUseSudo, the socket to ask.
const statusCallerEnv = "FERRY_TEST_STATUS_CALLER"

// TestStatus_ANonRootCallerIsToldToUseSudo: the socket is root's only
// (0600); a non-root `ferry status` while the agent runs is told to run
// it as root, never that the agent is not running.
func TestStatus_ANonRootCallerIsToldToUseSudo(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, to ask as another user")
	}
	dir, err := os.MkdirTemp("", "ferry-status-")
	must(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	must(t, os.Chmod(dir, 0o755))
	sock := filepath.Join(dir, "ferry.sock")
	_, c, _ := serveAt(t, sock)
	if _, err := c.Status(t.Context()); err != nil {
		t.Fatalf("root's own call: %v", err)
	}
	out := runAsNobody(t, dir, "TestStatus_CallerChild", statusCallerEnv+"="+sock)
	if !strings.Contains(out, "NOPERMISSION: ") || !strings.Contains(out, "sudo ferry") || strings.Contains(out, "not running") {
		t.Fatalf("the non-root caller was not told to use sudo:\n%s", out)
	}
}

// TestStatus_CallerChild is the asking side of
// TestStatus_ANonRootCallerIsToldToUseSudo, run as nobody; it does nothing
// in a plain test run.
func TestStatus_CallerChild(t *testing.T) {
	sock := os.Getenv(statusCallerEnv)
	if sock == "" {
		t.Skip("the asking side of TestStatus_ANonRootCallerIsToldToUseSudo")
	}
	_, err := NewClient(sock).Status(t.Context())
	if errors.Is(err, ErrNoPermission) {
		fmt.Printf("NOPERMISSION: %v\n", err)
		return
	}
	t.Fatalf("a non-root caller got %v, want ErrNoPermission", err)
}
