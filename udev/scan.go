package udev

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// Scan reports, as Add events with Scanned set, every block device under
// sys/class/block with a non-zero size, with the filesystem properties udev
// recorded in its database (udevData/b<major>:<minor>). A device udev has
// not processed yet has no FSType here; its udev event follows. Errors on
// single devices are joined and returned with the events that were read.
func Scan(sys, udevData string) ([]Event, error) {
	dir := filepath.Join(sys, "class", "block")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("%w: listing block devices: %w", ErrMonitor, err)
	}
	var evs []Event
	var errs []error
	for _, e := range entries {
		ev, ok, err := scanOne(filepath.Join(dir, e.Name()), udevData)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", e.Name(), err))
			continue
		}
		if ok {
			evs = append(evs, ev)
		}
	}
	sort.Slice(evs, func(i, j int) bool { return evs[i].DevPath < evs[j].DevPath })
	return evs, errors.Join(errs...)
}

func scanOne(devDir, udevData string) (Event, bool, error) {
	size := Size(devDir)
	if size == 0 {
		return Event{}, false, nil
	}
	kv, err := readProps(filepath.Join(devDir, "uevent"), "")
	if err != nil {
		return Event{}, false, err
	}
	name := kv["DEVNAME"]
	if name == "" {
		name = filepath.Base(devDir)
	}
	ev := Event{
		Action:  Add,
		DevPath: "/dev/" + name,
		DevType: kv["DEVTYPE"],
		Size:    size,
		Major:   parseUint32(kv["MAJOR"]),
		Minor:   parseUint32(kv["MINOR"]),
		Scanned: true,
	}
	ev.DiskSeq, _ = strconv.ParseUint(kv["DISKSEQ"], 10, 64)
	db, err := readProps(filepath.Join(udevData, fmt.Sprintf("b%d:%d", ev.Major, ev.Minor)), "E:")
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return Event{}, false, err
	}
	ev.FSType = db["ID_FS_TYPE"]
	ev.Label = db["ID_FS_LABEL"]
	return ev, true, nil
}

// readProps reads KEY=VALUE lines (those starting with prefix, which is
// cut) from a sysfs uevent file or a udev database file.
func readProps(path, prefix string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	kv := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), prefix)
		if !ok {
			continue
		}
		if k, v, ok := strings.Cut(line, "="); ok {
			kv[k] = v
		}
	}
	return kv, sc.Err()
}
