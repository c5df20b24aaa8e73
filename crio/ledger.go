package crio

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/ferry-edge/ferry/internal/atomicfile"
)

// ferry's own pins live in a ledger, by bundle; its crio.conf.d drop-in is
// never edited by itself but derived (render): the union of the ledger and
// of the pins the files before it hold now. A later drop-in's pinned_images
// replaces an earlier one's, so ferry's file must copy the others' (the
// machine config operator's 50-pinned-images first of all); rendering it
// again whenever they change (Sync, run by WatchConf) keeps that copy
// current, and the ledger says which pins are ferry's own, so a pin another
// file dropped leaves ferry's file too.

// LedgerName is the ledger's file name; its default place is beside
// crio.conf.d (the agent keeps it in its state dir).
const LedgerName = "ferry-pins.json"

// EarlierPins labels pins whose bundle the ledger does not know: those of a
// drop-in written before the ledger existed, or kept for the running
// release (Request.Keep) when no bundle entry holds them.
const EarlierPins = "earlier"

// ledger is what ferry pins and mirrors itself.
type ledger struct {
	// Pins are ferry's own pins by bundle label.
	Pins map[string][]string `json:"pins"`
	// Mirror is what ferry's registries.conf.d drop-in serves, kept to
	// render it again when the node's own registries change.
	Mirror *mirrorState `json:"mirror,omitempty"`
}

// mirrorState is the part of a Request its mirror drop-in is made from.
type mirrorState struct {
	Pull    []string          `json:"pull"`
	Mirrors map[string]string `json:"mirrors"`
	Addr    string            `json:"addr"`
	Label   string            `json:"label"`
}

func (m *mirrorState) request() Request {
	return Request{Pull: m.Pull, Mirrors: m.Mirrors, Addr: m.Addr, Label: m.Label}
}

// own is the sorted union of ferry's pins.
func (l *ledger) own() []string {
	return mergePins(slices.Collect(maps.Values(l.Pins))...)
}

// labels names the bundles whose pins ferry holds, for the drop-in's
// comment.
func (l *ledger) labels() string {
	names := slices.Sorted(maps.Keys(l.Pins))
	return strings.Join(names, ", ")
}

func (d *Dropins) ledgerPath() string {
	if d.Ledger != "" {
		return d.Ledger
	}
	return filepath.Join(filepath.Dir(filepath.Clean(d.CRIOConfDir)), LedgerName)
}

// readLedger reads the ledger. Without one, a drop-in of ferry's that is
// there (written before the ledger existed) is taken in: its pins that no
// file before it holds now are ferry's own, of an unknown bundle.
func (d *Dropins) readLedger() (*ledger, error) {
	l := &ledger{Pins: map[string][]string{}}
	b, err := os.ReadFile(d.ledgerPath())
	switch {
	case err == nil:
		if err := json.Unmarshal(b, l); err != nil {
			return nil, fmt.Errorf("%w: ferry's pin ledger %s is damaged (%v): remove it and run 'ferry cleanup' or load the bundle again", ErrDropin, d.ledgerPath(), err)
		}
		if l.Pins == nil {
			l.Pins = map[string][]string{}
		}
		return l, nil
	case !errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("%w: %v", ErrDropin, err)
	}
	pins, _, err := readPins(filepath.Join(d.CRIOConfDir, DropinName))
	if errors.Is(err, os.ErrNotExist) {
		return l, nil
	}
	if err != nil {
		return nil, err
	}
	before, err := d.PinsBefore()
	if err != nil {
		return nil, err
	}
	for _, p := range pins {
		if !slices.Contains(before, p) {
			l.Pins[EarlierPins] = append(l.Pins[EarlierPins], p)
		}
	}
	return l, nil
}

// saveLedger writes the ledger before the drop-ins that follow from it: a
// crash between the two is mended by the next render. An empty ledger is
// no file.
func (d *Dropins) saveLedger(l *ledger) error {
	for k, v := range l.Pins {
		if len(v) == 0 {
			delete(l.Pins, k)
		}
	}
	if len(l.Pins) == 0 && l.Mirror == nil {
		if _, err := removeIfExists(d.ledgerPath()); err != nil {
			return err
		}
		return nil
	}
	b, err := json.MarshalIndent(l, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(d.ledgerPath()), 0o700); err != nil {
		return fmt.Errorf("%w: %v", ErrDropin, err)
	}
	if err := atomicfile.WriteFile(d.ledgerPath(), b, 0o600); err != nil {
		return fmt.Errorf("%w: pin ledger: %v", ErrDropin, err)
	}
	return nil
}

// rendered are ferry's two drop-ins as the ledger and the node's files
// make them now: pins nil for a file that must not exist; mirrors nil
// leaves that file as it is (a ledger that has no mirror may come from a
// ferry that wrote one before the ledger existed: RemoveMirror removes it).
type rendered struct {
	pins, mirrors []byte
}

// render makes ferry's drop-ins from l and the other files as they are
// now, writing nothing: a refusal (a later file that overrides ferry's
// pins, a node registry ferry cannot keep) changes no file.
func (d *Dropins) render(l *ledger) (rendered, error) {
	var out rendered
	if own := l.own(); len(own) > 0 {
		before, err := d.PinsBefore()
		if err != nil {
			return out, err
		}
		pins := mergePins(before, own)
		if err := d.checkNotOverridden(pins); err != nil {
			return out, err
		}
		if out.pins, err = PinsConf(pins, l.labels()); err != nil {
			return out, err
		}
	}
	if l.Mirror != nil {
		site, err := d.SiteRegistries()
		if err != nil {
			return out, err
		}
		if out.mirrors, err = MirrorsConf(l.Mirror.request(), site); err != nil {
			return out, err
		}
	}
	return out, nil
}

// write puts rendered files in place: each only if its bytes differ.
func (d *Dropins) write(r rendered) (Change, error) {
	var ch Change
	var err error
	if r.mirrors != nil {
		if ch.Mirrors, err = writeIfChanged(filepath.Join(d.RegistriesConfDir, DropinName), r.mirrors, 0o644); err != nil {
			return ch, fmt.Errorf("%w: registries.conf.d: %v", ErrDropin, err)
		}
	}
	path := filepath.Join(d.CRIOConfDir, DropinName)
	if r.pins == nil {
		ch.Pins, err = removeIfExists(path)
		return ch, err
	}
	if ch.Pins, err = writeIfChanged(path, r.pins, 0o644); err != nil {
		return ch, fmt.Errorf("%w: crio.conf.d: %v", ErrDropin, err)
	}
	return ch, nil
}

// update changes the ledger with edit, then renders ferry's drop-ins
// from it and, once first (if not nil) has run, writes them. Nothing is
// written when the rendering is refused.
func (d *Dropins) update(edit func(*ledger), first func(*Change) error) (Change, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var ch Change
	l, err := d.readLedger()
	if err != nil {
		return ch, err
	}
	edit(l)
	r, err := d.render(l)
	if err != nil {
		return ch, err
	}
	if first != nil {
		if err := first(&ch); err != nil {
			return ch, err
		}
	}
	if err := d.saveLedger(l); err != nil {
		return ch, err
	}
	w, err := d.write(r)
	ch.Pins, ch.Mirrors = w.Pins, w.Mirrors
	return ch, err
}

// Sync renders ferry's drop-ins again from the ledger and the node's
// files as they are now: after another file in crio.conf.d changed its
// pinned_images, or the node's registries changed. Nothing of ferry's
// (no ledger, no drop-in) writes nothing.
func (d *Dropins) Sync() (Change, error) {
	return d.update(func(*ledger) {}, nil)
}

// Own returns ferry's own pins by bundle label (a copy).
func (d *Dropins) Own() (map[string][]string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	l, err := d.readLedger()
	if err != nil {
		return nil, err
	}
	return maps.Clone(l.Pins), nil
}
