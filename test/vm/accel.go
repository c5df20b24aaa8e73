package vm

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// ProbeAccelCached is ProbeAccel remembered in cacheDir for this host
// kernel, KVM module set, qemu binary and guest kernel, so that a host
// without working KVM pays the probe's budget once, not every run.
func ProbeAccelCached(ctx context.Context, cacheDir, kernelPath string, budget time.Duration) (string, string) {
	if a := os.Getenv("FERRY_VM_ACCEL"); a == "kvm" || a == "tcg" {
		return a, "FERRY_VM_ACCEL=" + a
	}
	osrel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	mods, _ := os.ReadFile("/proc/modules")
	var kvm []string
	for _, l := range strings.Split(string(mods), "\n") {
		if strings.HasPrefix(l, "kvm") {
			kvm = append(kvm, strings.Fields(l)[0])
		}
	}
	q := "no qemu"
	if p, err := exec.LookPath("qemu-system-x86_64"); err == nil {
		if st, err := os.Stat(p); err == nil {
			q = fmt.Sprint(st.Size(), st.ModTime().UnixNano())
		}
	}
	_, kvmErr := os.Stat("/dev/kvm")
	key := hashStrings(string(osrel), strings.Join(kvm, ","), q, kernelPath, fmt.Sprint(kvmErr == nil))
	p := filepath.Join(cacheDir, "accel-"+key)
	if b, err := os.ReadFile(p); err == nil {
		a, why, _ := strings.Cut(string(b), "\n")
		return a, why + " (cached in " + p + ")"
	}
	a, why := ProbeAccel(ctx, kernelPath, budget)
	if ctx.Err() == nil {
		_ = os.WriteFile(p, []byte(a+"\n"+why), 0o644)
	}
	return a, why
}

// ProbeAccel decides between KVM and TCG by booting the guest kernel under
// KVM with a one-file initramfs that prints a marker. A /dev/kvm that
// exists is not enough: on the project's machines it is backed by kvm_pvm,
// which cannot boot a stock Debian kernel. FERRY_VM_ACCEL=kvm|tcg skips the
// probe. It returns the accelerator and why.
func ProbeAccel(ctx context.Context, kernelPath string, budget time.Duration) (string, string) {
	if a := os.Getenv("FERRY_VM_ACCEL"); a == "kvm" || a == "tcg" {
		return a, "FERRY_VM_ACCEL=" + a
	}
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return "tcg", fmt.Sprintf("no usable /dev/kvm (%v)", err)
	}
	f.Close()
	dir, err := os.MkdirTemp("", "fvm-kvm-")
	if err != nil {
		return "tcg", err.Error()
	}
	defer os.RemoveAll(dir)
	ir := filepath.Join(dir, "ir")
	if err := os.MkdirAll(filepath.Join(ir, "bin"), 0o755); err != nil {
		return "tcg", err.Error()
	}
	if err := copyFile("/bin/busybox", filepath.Join(ir, "bin/busybox"), 0o755); err != nil {
		return "tcg", err.Error()
	}
	script := "#!/bin/busybox sh\n/bin/busybox echo FERRY-KVM-PROBE-OK\n/bin/busybox poweroff -f\n"
	if err := os.WriteFile(filepath.Join(ir, "init"), []byte(script), 0o755); err != nil {
		return "tcg", err.Error()
	}
	initrd := filepath.Join(dir, "initrd")
	cpio := exec.CommandContext(ctx, "sh", "-c", "find . | cpio -o -H newc --quiet | gzip -1 > "+initrd)
	cpio.Dir = ir
	if out, err := cpio.CombinedOutput(); err != nil {
		return "tcg", fmt.Sprintf("probe initramfs: %v: %s", err, out)
	}
	pctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	console := filepath.Join(dir, "console")
	cmd := exec.CommandContext(pctx, "qemu-system-x86_64", "-accel", "kvm", "-cpu", "host", "-m", "256",
		"-nodefaults", "-no-user-config", "-display", "none", "-nic", "none", "-no-reboot",
		"-serial", "file:"+console, "-kernel", kernelPath, "-initrd", initrd,
		"-append", "console=ttyS0 quiet panic=-1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	start := time.Now()
	out, _ := cmd.CombinedOutput()
	took := time.Since(start).Round(10 * time.Millisecond)
	con, _ := os.ReadFile(console)
	if bytes.Contains(con, []byte("FERRY-KVM-PROBE-OK")) {
		return "kvm", fmt.Sprintf("KVM booted the guest kernel in %s", took)
	}
	why := "no marker within " + budget.String()
	if len(out) > 0 {
		why = string(bytes.TrimSpace(out))
	}
	return "tcg", fmt.Sprintf("KVM did not boot the guest kernel (%s) -> TCG", why)
}
