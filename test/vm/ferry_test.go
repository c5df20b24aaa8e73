package vm

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/bundle"
)

// ferryStatus is what `ferry status -o json` prints, as a user reads it.
type ferryStatus struct {
	Node    string `json:"node"`
	Phase   string `json:"phase"`
	Bundle  string `json:"bundle"`
	Digest  string `json:"digest"`
	Error   string `json:"error"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
	// ClusterMessage is the cluster version operator's progress line.
	ClusterMessage string `json:"clusterMessage"`
	Line           string `json:"line"`
	Healthy        bool   `json:"healthy"`
	Bundles        []struct {
		Name      string `json:"name"`
		Digest    string `json:"digest"`
		Phase     string `json:"phase"`
		Condition struct {
			Reason  string `json:"reason"`
			Message string `json:"message"`
		} `json:"condition"`
	} `json:"bundles"`
}

func (s ferryStatus) String() string {
	out := fmt.Sprintf("phase=%s bundle=%s digest=%.19s", s.Phase, s.Bundle, s.Digest)
	if s.Error != "" {
		out += " error=" + s.Error
	}
	if s.Reason != "" {
		out += " reason=" + s.Reason
	}
	return out
}

// loadedWith reports whether the node holds digest loaded (or beyond).
func (s ferryStatus) loadedWith(digest string) bool {
	return (s.Phase == "loaded" || s.Phase == "cluster-ready") && s.Digest == digest
}

// rejected is the message of digest's refusal, if any.
func (s ferryStatus) rejected(digest string) (string, bool) {
	for _, b := range s.Bundles {
		if b.Digest == digest && (b.Phase == "rejected" || b.Phase == "failed") {
			return b.Condition.Message, true
		}
	}
	return "", false
}

func readStatus(ctx context.Context, v *VM) (ferryStatus, string, error) {
	r, err := v.Run(ctx, "ferry status -o json")
	if err != nil {
		return ferryStatus{}, "", err
	}
	var s ferryStatus
	if err := json.Unmarshal([]byte(r.Stdout), &s); err != nil {
		return s, r.Stdout + r.Stderr, fmt.Errorf("ferry status -o json (exit %d): %v: %s%s", r.Code, err, r.Stdout, r.Stderr)
	}
	return s, r.Stdout, nil
}

// reactTimeout bounds the wait for the first change of ferry's status
// after a stick is plugged.
const reactTimeout = 3 * time.Minute

// waitStatus polls `ferry status -o json` until done says so, logging each
// new phase; it fails the test when fail says so or at the timeout.
func waitStatus(t *testing.T, ctx context.Context, v *VM, timeout time.Duration, done, fail func(ferryStatus) bool) ferryStatus {
	t.Helper()
	s, err := pollStatus(t, ctx, v, timeout, done, fail)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// pollStatus is waitStatus returning its failure (for use off the test's
// goroutine).
func pollStatus(t *testing.T, ctx context.Context, v *VM, timeout time.Duration, done, fail func(ferryStatus) bool) (ferryStatus, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	last, lastErr, first := "", "", ""
	for {
		s, raw, err := readStatus(ctx, v)
		if err == nil {
			if first == "" {
				first = s.String()
			} else if first != "stirred" && s.String() != first {
				first = "stirred"
			}
			// a node that never reacts fails in minutes, not at the load timeout
			if first != "stirred" && time.Since(start) > reactTimeout {
				return s, fmt.Errorf("%s: ferry did not react within %s: its status stayed %q\n%s",
					v.Name(), reactTimeout, s, diag(context.Background(), v))
			}
			if p := s.String(); p != last {
				t.Logf("%s +%.1fs: %s", v.Name(), time.Since(start).Seconds(), p)
				last = p
			}
			if done(s) {
				return s, nil
			}
			if fail != nil && fail(s) {
				return s, fmt.Errorf("%s: ferry status: %s\n%s\n%s", v.Name(), s, raw, diag(context.Background(), v))
			}
		} else if err.Error() != lastErr {
			t.Logf("%s +%.1fs: %v", v.Name(), time.Since(start).Seconds(), err)
			lastErr = err.Error()
		}
		select {
		case <-ctx.Done():
			return s, fmt.Errorf("%s: ferry status did not reach the wanted state in %s; last: %s %v\n%s",
				v.Name(), timeout, last, err, diag(context.Background(), v))
		case <-time.After(100 * time.Millisecond):
		}
		// Wait in the guest for a phase to change rather than poll with
		// `ferry status`: under TCG each call costs ~0.25 s of a vCPU,
		// which at two calls a second would slow the node it measures.
		_, _ = v.Run(ctx, waitPhaseChange)
	}
}

// waitPhaseChange returns once the phase in one of ferry's state records
// changes (or a record appears), or after 5 s. Its loop forks only
// `sleep` while nothing changes.
const waitPhaseChange = `d=/var/lib/ferry/bundles; ref=/run/ferry-vm-wait.$$
phases() { cat $d/*.json 2>/dev/null | grep -o '"phase": *"[a-z-]*"' | tr -d '\n'; }
touch $ref; p0=$(phases); i=0
while [ $i -lt 50 ]; do
  for f in $d/*.json; do
    if [ "$f" -nt $ref ]; then touch $ref; [ "$(phases)" != "$p0" ] && { rm -f $ref; exit 0; }; break; fi
  done
  sleep 0.1; i=$((i+1))
done
rm -f $ref`

// diag is what a person debugging a failed scenario wants from the guest.
func diag(ctx context.Context, v *VM) string {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	r, err := v.Run(ctx, "lsblk -o NAME,SIZE,FSTYPE,LABEL; systemctl status ferry crio --no-pager -l -n 0; journalctl -u ferry --no-pager -n 60 -o short-monotonic; journalctl -u crio --no-pager -o short-monotonic | grep -iE 'reload|error|pull' | tail -20")
	if err != nil {
		return err.Error()
	}
	return r.Stdout + r.Stderr
}

// pinnedState maps each of refs to "pinned", "unpinned" or "missing" as
// CRI-O reports them through crictl.
func pinnedState(t *testing.T, ctx context.Context, v *VM, refs []string) map[string]string {
	t.Helper()
	imgs := guestImages(t, ctx, v)
	out := map[string]string{}
	for _, ref := range refs {
		out[ref] = "missing"
		for _, im := range imgs {
			if slices.Contains(im.RepoDigests, ref) || slices.Contains(im.RepoTags, ref) {
				out[ref] = map[bool]string{true: "pinned", false: "unpinned"}[im.Pinned]
			}
		}
	}
	return out
}

func requireAllPinned(t *testing.T, ctx context.Context, v *VM, refs []string) {
	t.Helper()
	st := pinnedState(t, ctx, v, refs)
	bad := 0
	for _, ref := range refs {
		if st[ref] != "pinned" {
			t.Errorf("%s: %s is %s in CRI-O, want pinned", v.Name(), ref, st[ref])
			bad++
		}
	}
	if bad == 0 {
		t.Logf("%s: all %d images of the bundle present and pinned in CRI-O", v.Name(), len(refs))
	}
}

// nodeConfig is /etc/ferry/config.toml for a test node.
func nodeConfig(name string, approved []string, listen string, peers []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "node_name = %q\n", name)
	if len(approved) > 0 {
		fmt.Fprintf(&b, "approved_digests = [%s]\n", quoteList(approved))
	} else {
		b.WriteString("approval = \"off\"\n")
	}
	fmt.Fprintf(&b, "\n[peer]\nlisten = %q\n", listen)
	if len(peers) > 0 {
		// The guests' own link-local network: open instead of delivering a
		// token file to each guest.
		fmt.Fprintf(&b, "peers = [%s]\nopen = true\n", quoteList(peers))
	}
	fmt.Fprintf(&b, "\n[cluster]\nschedule = \"Automatic\"\non_ready = [\"/usr/local/bin/ferry-vm-on-ready\"]\n")
	return b.String()
}

func quoteList(s []string) string {
	q := make([]string, len(s))
	for i, x := range s {
		q[i] = fmt.Sprintf("%q", x)
	}
	return strings.Join(q, ", ")
}

// usbDisk waits for the newest USB disk in the guest and returns its path.
func usbDisk(t *testing.T, ctx context.Context, v *VM) string {
	t.Helper()
	return strings.TrimSpace(sh(t, ctx, v, `for i in $(seq 1200); do
		for d in /dev/disk/by-id/usb-*; do [ -e "$d" ] && case "$d" in *-part*) ;; *) readlink -f "$d"; exit 0;; esac; done
		sleep 0.1; done; echo "no USB disk appeared" >&2; exit 1`))
}

// floor is the fastest a node could go from stick to images in CRI-O,
// measured in the guest: read the bundle off the stick, then pull every
// image with crictl, 4 at a time, from a registry serving the extracted
// bundle (Debian's docker-registry) through a mirror, as ferry pulls.
type floor struct {
	ReadSeconds float64
	PullSeconds float64
}

func (f floor) Total() float64 { return f.ReadSeconds + f.PullSeconds }

// measureFloor needs ferry stopped (it would take the stick) and leaves the
// guest as it found it: the images removed, the mirror gone, ferry started.
func measureFloor(t *testing.T, ctx context.Context, v *VM, b *testBundle, stickImg string, raw bool) (floor, bool) {
	t.Helper()
	if try(t, ctx, v, "test -x /usr/local/bin/docker-registry").Code != 0 {
		t.Logf("floor not measured: no docker-registry in the guest (install it on the host: test/setup/install-deps.sh)")
		return floor{}, false
	}
	sh(t, ctx, v, "systemctl stop ferry")
	if err := v.PlugUSB(ctx, "floor", stickImg, true); err != nil {
		t.Fatal(err)
	}
	dev := usbDisk(t, ctx, v)
	src := dev
	if !raw {
		sh(t, ctx, v, "mkdir -p /mnt/floor && mount -o ro "+dev+" /mnt/floor")
		src = "/mnt/floor/" + filepath.Base(b.Tar)
	}
	sh(t, ctx, v, "sync; echo 3 > /proc/sys/vm/drop_caches")
	var f floor
	// a raw device is read up to the tar's end, as ferry does
	r := sh2(t, ctx, v, fmt.Sprintf("head -c %d %s > /dev/null", b.Bytes, src))
	f.ReadSeconds = r.Seconds
	sh(t, ctx, v, fmt.Sprintf("rm -rf /var/tmp/floor && mkdir -p /var/tmp/floor && head -c %d %s | tar -x -C /var/tmp/floor", b.Bytes, src))
	if !raw {
		sh(t, ctx, v, "umount /mnt/floor")
	}
	if err := v.UnplugUSB(ctx, "floor"); err != nil {
		t.Fatal(err)
	}

	crt, key := selfSigned(t)
	files := map[string]string{
		"/etc/ferry-vm/floor/tls.crt":                   crt,
		"/etc/ferry-vm/floor/tls.key":                   key,
		"/etc/containers/certs.d/127.0.0.1:5999/ca.crt": crt,
		"/etc/ferry-vm/floor/registry.yml": "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: /var/tmp/floor\n" +
			"  maintenance:\n    readonly:\n      enabled: true\nhttp:\n  addr: 127.0.0.1:5999\n  tls:\n" +
			"    certificate: /etc/ferry-vm/floor/tls.crt\n    key: /etc/ferry-vm/floor/tls.key\n",
		"/etc/containers/registries.conf.d/zz-ferry-vm-floor.conf": mirrorsConf(b.Refs, "127.0.0.1:5999"),
		"/etc/ferry-vm/floor/refs":                                 strings.Join(b.Refs, "\n") + "\n",
	}
	for p, data := range files {
		if err := v.WriteFile(ctx, p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	sh(t, ctx, v, `systemd-run --quiet --unit=ferry-vm-floor-registry /usr/local/bin/docker-registry serve /etc/ferry-vm/floor/registry.yml &&
		for i in $(seq 600); do bash -c 'exec 3<>/dev/tcp/127.0.0.1/5999' 2>/dev/null && exit 0; sleep 0.1; done; exit 1`)
	reloadCRIO(t, ctx, v)
	// crictl checks its connection with ImageFsInfo, which in CRI-O 1.34
	// can race a concurrent pull's temporary file ("lstat
	// .tmp-images.json…: no such file or directory"): a failed pull is
	// tried once more.
	r = sh2(t, ctx, v, crictl+" --version >/dev/null; xargs -P4 -n1 sh -c '"+crictl+` pull "$0" || `+crictl+` pull "$0"' < /etc/ferry-vm/floor/refs > /dev/null`)
	f.PullSeconds = r.Seconds
	st := pinnedState(t, ctx, v, b.Refs)
	for _, ref := range b.Refs {
		if st[ref] == "missing" {
			t.Errorf("floor: crictl pull through the stand-in mirror did not bring %s", ref)
		}
	}
	// undo: the node must look untouched to ferry
	sh(t, ctx, v, `xargs `+crictl+` rmi < /etc/ferry-vm/floor/refs > /dev/null; systemctl stop ferry-vm-floor-registry;
		rm -rf /var/tmp/floor /etc/ferry-vm/floor /etc/containers/registries.conf.d/zz-ferry-vm-floor.conf /etc/containers/certs.d/127.0.0.1:5999`)
	reloadCRIO(t, ctx, v)
	sh(t, ctx, v, "sync; echo 3 > /proc/sys/vm/drop_caches; systemctl start ferry")
	t.Logf("%s: floor %.1fs = read the stick %.1fs (%.1f MiB/s) + crictl pull of %d images, 4 at a time, %.1fs (stand-in registry through a mirror)",
		v.Name(), f.Total(), f.ReadSeconds, float64(b.Bytes)/(1<<20)/f.ReadSeconds, len(b.Refs), f.PullSeconds)
	return f, true
}

// sh2 is sh returning the whole result (for its guest-side duration).
func sh2(t *testing.T, ctx context.Context, v *VM, cmd string) Result {
	t.Helper()
	r := try(t, ctx, v, cmd)
	if r.Code != 0 {
		t.Fatalf("%s: %q exited %d: %s%s", v.Name(), cmd, r.Code, r.Stdout, r.Stderr)
	}
	return r
}

// reloadCRIO reloads crio through systemd and waits until crio has applied
// the new configuration (it does so asynchronously after the job ends).
func reloadCRIO(t *testing.T, ctx context.Context, v *VM) {
	t.Helper()
	sh(t, ctx, v, `n=$(journalctl -u crio -o cat | grep -c 'reload completed'); systemctl reload crio &&
		for i in $(seq 600); do [ "$(journalctl -u crio -o cat | grep -c 'reload completed')" -gt "$n" ] && exit 0; sleep 0.1; done;
		echo "crio did not complete its reload" >&2; exit 1`)
}

// mirrorsConf maps each repository of refs to host, under the path the
// bundle stores it (bundle.RepoPaths).
func mirrorsConf(refs []string, host string) string {
	var b strings.Builder
	paths := bundle.RepoPaths(refs)
	for _, name := range sortedKeys(paths) {
		fmt.Fprintf(&b, "[[registry]]\nprefix = %q\nlocation = %q\n\n[[registry.mirror]]\nlocation = %q\n\n", name, name, host+"/"+paths[name])
	}
	return b.String()
}

func selfSigned(t *testing.T) (certPEM, keyPEM string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ferry-vm floor registry"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kd, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})),
		string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd}))
}

// bundleImages is FERRY_VM_IMAGES (default 30) and the bytes of each
// image's own layer (FERRY_VM_IMAGE_KIB, default 1024).
func bundleImages() (int, int64) {
	n, kib := 30, int64(1024)
	fmt.Sscan(os.Getenv("FERRY_VM_IMAGES"), &n)
	fmt.Sscan(os.Getenv("FERRY_VM_IMAGE_KIB"), &kib)
	return n, kib << 10
}
