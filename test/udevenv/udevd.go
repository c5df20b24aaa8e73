// Package udevenv is the harness for tests against the host's real udev:
// it runs systemd-udevd while a test binary needs it, makes disk images
// (vfat, ext4, raw tar) and attaches them as loop devices, which makes the
// kernel and udev report them as a plugged stick would be reported.
//
// It needs root, Debian's udev, util-linux (losetup), dosfstools + mtools
// and e2fsprogs (test/setup/install-deps.sh). A test calls Require first;
// with CI=true a missing piece fails the test, elsewhere it skips it.
//
//	func TestMain(m *testing.M) { os.Exit(udevenv.Main(m)) }
package udevenv

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// UdevdPath is Debian's udev daemon.
const UdevdPath = "/lib/systemd/systemd-udevd"

// stateDir holds the locks and the pid file that let several test binaries
// (go test runs packages in parallel) share one udevd: the first starts
// it, the last one out stops it, and a udevd the tests did not start is
// never stopped.
const stateDir = "/run/ferry-test/udevd"

var (
	mainRan  bool
	setupErr error
)

// Main runs m's tests with systemd-udevd running, starting it if no udevd
// runs, and stopping it afterwards if the tests started it and no other
// test binary still uses it. Call it from TestMain.
//
// Test binaries that use Main run one at a time (an exclusive lock held
// for the whole run): an agent under test watches every block device of
// the host, so another package's sticks must not appear meanwhile.
func Main(m *testing.M) int {
	mainRan = true
	var release func()
	if os.Geteuid() == 0 {
		if err := os.MkdirAll(stateDir, 0o755); err != nil {
			setupErr = err
		} else if devices, err := lockFile(filepath.Join(stateDir, "devices.lock"), syscall.LOCK_EX); err != nil {
			setupErr = err
		} else {
			defer devices.Close()
			release, setupErr = acquireUdevd()
		}
	}
	code := m.Run()
	if release != nil {
		release()
	}
	return code
}

// Require stops the test (fails it under CI=true, skips it elsewhere)
// unless it can run: root, the tools, and udevd started by Main.
func Require(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		need(t, "needs root (loop devices, mounts, udevd)")
	}
	for tool, pkg := range map[string]string{
		"losetup": "util-linux", "mkfs.vfat": "dosfstools", "mcopy": "mtools",
		"mkfs.ext4": "e2fsprogs", "udevadm": "udev",
	} {
		if _, err := exec.LookPath(tool); err != nil {
			need(t, tool+" not found: apt-get install "+pkg+" (test/setup/install-deps.sh)")
		}
	}
	if _, err := os.Stat(UdevdPath); err != nil {
		need(t, UdevdPath+" not found: apt-get install udev (test/setup/install-deps.sh)")
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		need(t, "no /dev/loop-control: this kernel has no loop devices")
	}
	if !mainRan {
		t.Fatal("udevenv: call udevenv.Main from the package's TestMain")
	}
	if setupErr != nil {
		need(t, "systemd-udevd: "+setupErr.Error())
	}
}

// CanMount reports whether the running kernel has a driver for fstype
// (vfat is missing from some VM kernels; nothing a package can install).
func CanMount(fstype string) bool {
	b, err := os.ReadFile("/proc/filesystems")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && f[len(f)-1] == fstype {
			return true
		}
	}
	return false
}

// RequireFS stops the test (fails it under CI=true, skips it elsewhere)
// unless the running kernel can mount fstype: when /proc/filesystems
// lacks it, it loads the module first (modprobe fstype), as mount would.
func RequireFS(t testing.TB, fstype string) {
	t.Helper()
	if CanMount(fstype) {
		return
	}
	out, err := exec.Command("modprobe", fstype).CombinedOutput()
	if CanMount(fstype) {
		return
	}
	why := "not in /proc/filesystems"
	if err != nil {
		why = fmt.Sprintf("modprobe %s: %v: %s", fstype, err, strings.TrimSpace(string(out)))
	}
	need(t, fmt.Sprintf("this kernel cannot mount %s (%s)", fstype, why))
}

func need(t testing.TB, msg string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// acquireUdevd makes sure a udevd runs and registers this process as one
// of its users until release.
func acquireUdevd() (release func(), err error) {
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		return nil, err
	}
	start, err := lockFile(filepath.Join(stateDir, "start.lock"), syscall.LOCK_EX)
	if err != nil {
		return nil, err
	}
	defer start.Close() // unlocks
	if udevdPid() == 0 {
		if err := startUdevd(); err != nil {
			return nil, err
		}
	}
	users, err := lockFile(filepath.Join(stateDir, "users.lock"), syscall.LOCK_SH)
	if err != nil {
		return nil, err
	}
	return func() {
		defer users.Close()
		start, err := lockFile(filepath.Join(stateDir, "start.lock"), syscall.LOCK_EX)
		if err != nil {
			return
		}
		defer start.Close()
		// Exclusive only when no other test binary holds its shared lock.
		if syscall.Flock(int(users.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
			return
		}
		stopStartedUdevd()
	}, nil
}

func lockFile(path string, how int) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), how); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return f, nil
}

var pidFile = filepath.Join(stateDir, "udevd.pid")

func startUdevd() error {
	out, err := exec.Command(UdevdPath, "--daemon").CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s --daemon: %w: %s", UdevdPath, err, out)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		pid := udevdPid()
		_, cerr := os.Stat("/run/udev/control")
		if pid != 0 && cerr == nil {
			return os.WriteFile(pidFile, []byte(strconv.Itoa(pid)+"\n"), 0o644)
		}
		if time.Now().After(deadline) {
			return errors.New("started systemd-udevd --daemon, but it is not running 10 s later")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stopStartedUdevd stops the udevd whose pid the tests recorded, if it is
// still that udevd.
func stopStartedUdevd() {
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return
	}
	defer os.Remove(pidFile)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || comm(pid) != "systemd-udevd" {
		return
	}
	if syscall.Kill(pid, syscall.SIGTERM) != nil {
		return
	}
	for i := 0; i < 250 && comm(pid) == "systemd-udevd"; i++ {
		time.Sleep(20 * time.Millisecond)
	}
}

// udevdPid is the pid of the running udev daemon (not one of its workers),
// or 0.
func udevdPid() int {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || comm(pid) != "systemd-udevd" {
			continue
		}
		if comm(ppid(pid)) != "systemd-udevd" {
			return pid
		}
	}
	return 0
}

// comm is a live process's command name ("" when gone or a zombie).
func comm(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	s := string(b)
	open, close := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || close < open || len(s) < close+3 || s[close+2] == 'Z' {
		return ""
	}
	return s[open+1 : close]
}

func ppid(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 2 {
		return 0
	}
	p, _ := strconv.Atoi(f[1])
	return p
}
