package packaging

import (
	"regexp"
	"strings"
	"testing"
)

// udevDevice is what a rule sees of a block device: its own keys, its
// udev properties, and its ancestors (nearest first) for SUBSYSTEMS and
// ATTRS.
type udevDevice struct {
	action, subsystem, kernel, devpath string
	env                                map[string]string
	parents                            []udevParent
}

type udevParent struct {
	subsystem string
	attrs     map[string]string
}

var udevToken = regexp.MustCompile(`^([A-Z_]+)(?:\{([^}]*)\})?(==|!=|\+=|:=|=)"([^"]*)"$`)

// udevGlob is udev's match of value against a pattern: fnmatch without
// FNM_PATHNAME ('*' spans '/'), alternatives split by '|'.
func udevGlob(pattern, value string) bool {
	for _, alt := range strings.Split(pattern, "|") {
		var re strings.Builder
		re.WriteString("^")
		for i := 0; i < len(alt); i++ {
			switch c := alt[i]; c {
			case '*':
				re.WriteString(".*")
			case '?':
				re.WriteString(".")
			case '[':
				j := strings.IndexByte(alt[i:], ']')
				re.WriteString(strings.Replace(alt[i:i+j+1], "[!", "[^", 1))
				i += j
			default:
				re.WriteString(regexp.QuoteMeta(string(c)))
			}
		}
		if regexp.MustCompile(re.String() + "$").MatchString(value) {
			return true
		}
	}
	return false
}

// runUdevRules evaluates rules (the subset 80-ferry-install.rules uses:
// matches on ACTION, SUBSYSTEM, KERNEL, DEVPATH, ENV, SUBSYSTEMS, ATTRS;
// GOTO, LABEL, TAG and ENV{SYSTEMD_WANTS}) for dev and returns what it
// adds to SYSTEMD_WANTS. A key it does not know fails the test, so that
// the rules cannot grow a condition this evaluation ignores.
func runUdevRules(t *testing.T, rules string, dev udevDevice) []string {
	t.Helper()
	var wants []string
	skipTo := ""
	for n, line := range strings.Split(rules, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		var toks [][]string
		for _, f := range strings.Split(line, ",") {
			m := udevToken.FindStringSubmatch(strings.TrimSpace(f))
			if m == nil {
				t.Fatalf("rules:%d: cannot read %q", n+1, f)
			}
			toks = append(toks, m[1:])
		}
		if skipTo != "" {
			if toks[0][0] == "LABEL" && toks[0][3] == skipTo {
				skipTo = ""
			}
			continue
		}
		matched := true
		var acts [][]string
		for _, tk := range toks {
			key, attr, op, val := tk[0], tk[1], tk[2], tk[3]
			if op != "==" && op != "!=" {
				acts = append(acts, tk)
				continue
			}
			var ok bool
			switch key {
			case "ACTION":
				ok = udevGlob(val, dev.action)
			case "SUBSYSTEM":
				ok = udevGlob(val, dev.subsystem)
			case "KERNEL":
				ok = udevGlob(val, dev.kernel)
			case "DEVPATH":
				ok = udevGlob(val, dev.devpath)
			case "ENV":
				ok = udevGlob(val, dev.env[attr])
			case "SUBSYSTEMS", "ATTRS":
				if op == "!=" {
					t.Fatalf("rules:%d: %s!= is not evaluated here", n+1, key)
				}
				for _, p := range append([]udevParent{{subsystem: dev.subsystem}}, dev.parents...) {
					if key == "SUBSYSTEMS" && udevGlob(val, p.subsystem) {
						ok = true
					}
					if v, has := p.attrs[attr]; key == "ATTRS" && has && udevGlob(val, v) {
						ok = true
					}
				}
			default:
				t.Fatalf("rules:%d: key %s is not evaluated here", n+1, key)
			}
			if op == "!=" {
				ok = !ok
			}
			matched = matched && ok
		}
		if !matched {
			continue
		}
		for _, a := range acts {
			switch {
			case a[0] == "GOTO":
				skipTo = a[3]
			case a[0] == "LABEL", a[0] == "TAG":
			case a[0] == "ENV" && a[1] == "SYSTEMD_WANTS" && a[2] == "+=":
				wants = append(wants, strings.ReplaceAll(a[3], "%k", dev.kernel))
			default:
				t.Fatalf("rules:%d: action %v is not evaluated here", n+1, a)
			}
		}
	}
	return wants
}

// TestInstallRule_StartsTheInstallerForSticksOnly: the installer starts
// for a USB stick, a BMC's virtual media (a USB CD-ROM) and an SD card
// with a filesystem it reads; never for a network LUN, whatever its
// target sets (the removable flag) or its record claims, nor for a device
// only flagged removable.
func TestInstallRule_StartsTheInstallerForSticksOnly(t *testing.T) {
	rules := repoFile(t, mcDir+"/80-ferry-install.rules")
	usb := []udevParent{{subsystem: "block", attrs: map[string]string{"removable": "1"}}, {subsystem: "scsi"}, {subsystem: "usb"}, {subsystem: "pci"}}
	for _, tt := range []struct {
		name  string
		dev   udevDevice
		start bool
	}{
		{"usb stick", udevDevice{"add", "block", "sdb1", "/devices/pci0000:00/0000:00:14.0/usb2/2-1/2-1:1.0/host6/target6:0:0/6:0:0:0/block/sdb/sdb1",
			map[string]string{"ID_FS_TYPE": "vfat", "ID_BUS": "usb", "ID_PATH": "pci-0000:00:14.0-usb-0:1:1.0-scsi-0:0:0:0"}, usb}, true},
		{"usb stick whose record lacks the bus", udevDevice{"change", "block", "sdc", "/devices/pci0000:00/0000:00:14.0/usb2/2-2/2-2:1.0/host7/target7:0:0/7:0:0:0/block/sdc",
			map[string]string{"ID_FS_TYPE": "exfat"}, usb}, true},
		{"bmc virtual media", udevDevice{"change", "block", "sr0", "/devices/pci0000:00/0000:00:14.0/usb1/1-4/1-4:1.0/host12/target12:0:0/12:0:0:0/block/sr0",
			map[string]string{"ID_FS_TYPE": "iso9660", "ID_BUS": "usb", "ID_CDROM": "1", "ID_PATH": "pci-0000:00:14.0-usb-0:4:1.0-scsi-0:0:0:0"}, usb}, true},
		{"sd card", udevDevice{"add", "block", "mmcblk0p1", "/devices/pci0000:00/0000:00:1c.0/mmc_host/mmc0/mmc0:0001/block/mmcblk0/mmcblk0p1",
			map[string]string{"ID_FS_TYPE": "vfat"}, []udevParent{{subsystem: "block"}, {subsystem: "mmc"}}}, true},
		{"usb stick with ext4", udevDevice{"add", "block", "sdb1", "/devices/pci0000:00/0000:00:14.0/usb2/2-1/2-1:1.0/host6/target6:0:0/6:0:0:0/block/sdb/sdb1",
			map[string]string{"ID_FS_TYPE": "ext4", "ID_BUS": "usb"}, usb}, false},
		{"usb stick removed", udevDevice{"remove", "block", "sdb1", "/devices/pci0000:00/0000:00:14.0/usb2/2-1/2-1:1.0/host6/target6:0:0/6:0:0:0/block/sdb/sdb1",
			map[string]string{"ID_FS_TYPE": "vfat", "ID_BUS": "usb"}, usb}, false},
		{"iscsi LUN flagged removable", udevDevice{"add", "block", "sdd", "/devices/platform/host3/session1/target3:0:0/3:0:0:1/block/sdd",
			map[string]string{"ID_FS_TYPE": "vfat", "ID_BUS": "scsi", "ID_PATH": "ip-10.0.0.5:3260-iscsi-iqn.2024-01.example:usb-lun-1"},
			[]udevParent{{subsystem: "block", attrs: map[string]string{"removable": "1"}}, {subsystem: "scsi"}, {subsystem: "iscsi_session"}}}, false},
		{"iscsi LUN whose record claims usb", udevDevice{"add", "block", "sde", "/devices/platform/host3/session1/target3:0:0/3:0:0:2/block/sde",
			map[string]string{"ID_FS_TYPE": "vfat", "ID_BUS": "usb"},
			[]udevParent{{subsystem: "block", attrs: map[string]string{"removable": "1"}}, {subsystem: "scsi"}}}, false},
		{"fibre channel LUN flagged removable", udevDevice{"add", "block", "sdk", "/devices/pci0000:00/0000:05:00.0/host11/rport-11:0-2/target11:0:0/11:0:0:0/block/sdk",
			map[string]string{"ID_FS_TYPE": "vfat", "ID_BUS": "scsi", "ID_PATH": "pci-0000:05:00.0-fc-0x500601603ce01a2b-lun-0"},
			[]udevParent{{subsystem: "block", attrs: map[string]string{"removable": "1"}}, {subsystem: "scsi"}, {subsystem: "fc_remote_ports"}}}, false},
		{"virtio disk", udevDevice{"add", "block", "vdb", "/devices/pci0000:00/0000:00:05.0/virtio2/block/vdb",
			map[string]string{"ID_FS_TYPE": "vfat", "ID_PATH": "pci-0000:00:05.0"}, []udevParent{{subsystem: "virtio"}, {subsystem: "pci"}}}, false},
		{"virtio-scsi cd-rom flagged removable", udevDevice{"change", "block", "sr1", "/devices/pci0000:00/0000:00:07.0/virtio5/host13/target13:0:0/13:0:0:0/block/sr1",
			map[string]string{"ID_FS_TYPE": "iso9660", "ID_BUS": "scsi", "ID_PATH": "pci-0000:00:07.0-scsi-0:0:0:0"},
			[]udevParent{{subsystem: "block", attrs: map[string]string{"removable": "1"}}, {subsystem: "scsi"}, {subsystem: "virtio"}}}, false},
		{"nbd", udevDevice{"change", "block", "nbd0", "/devices/virtual/block/nbd0", map[string]string{"ID_FS_TYPE": "vfat"}, nil}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := runUdevRules(t, rules, tt.dev)
			want := []string(nil)
			if tt.start {
				want = []string{"ferry-install@" + tt.dev.kernel + ".service"}
			}
			if strings.Join(got, " ") != strings.Join(want, " ") {
				t.Errorf("SYSTEMD_WANTS += %v, want %v", got, want)
			}
		})
	}
}
