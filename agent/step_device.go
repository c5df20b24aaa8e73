package agent

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/opencontainers/go-digest"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/internal/sha256digest"
)

// Transitions of sticks and files: a device plugged or pulled (evDevice),
// a probe's offer (evOffer), and the extraction it starts.

func (m *machine) device(ev DeviceEvent) []effect {
	if ev.Action == "remove" {
		if m.job != nil && m.job.device == ev.Device {
			m.log.Warn("the stick was pulled while it was being read", "device", ev.Device)
			return []effect{effStopJob{}}
		}
		return nil
	}
	if !m.hasMedia || m.probing[ev.Device] || m.job != nil && m.job.device == ev.Device {
		return nil // a change event for a stick already being looked at
	}
	m.probing[ev.Device] = true
	var held digest.Digest
	if m.active != nil {
		held = m.active.Digest
	}
	return []effect{effProbe{origin: OriginStick, ev: ev, held: held}}
}

// offer decides what to do with a bundle a probe found. Its medium is
// closed unless an extraction keeps it: effs is named so that the
// deferred close reaches the caller.
func (m *machine) offer(o evOffer) (effs []effect) {
	delete(m.probing, o.device)
	log := m.log.With("device", o.device)
	keep := false
	defer func() {
		if o.medium != 0 && !keep {
			effs = append(effs, effCloseMedium{o.medium})
		}
	}()
	reply := func(err error) {
		if o.reply != 0 {
			effs = append(effs, effReply{o.reply, err})
		}
	}
	switch {
	case o.noBundle:
		log.Debug("not an upgrade stick", "err", o.err)
		reply(o.err)
		return effs
	case o.meta == nil:
		effs = append(effs, m.reject(m.newRecord(o, nil), o.err)...)
		reply(nil)
		return effs
	}
	log = log.With("bundle", o.src.Name())
	if act := m.active; act != nil && !(m.sameBundle(o, act) && act.Phase == PhaseDetected && m.job == nil) {
		effs = append(effs, m.offerWhileHeld(o, act, log)...)
		reply(nil)
		return effs
	}
	if m.active != nil {
		log.Info("resuming the copy of this bundle")
	}
	if m.job != nil {
		reply(fmt.Errorf("busy (%s); try again when it is done", m.job.kind))
		return effs
	}
	r := m.active
	if r == nil {
		r = m.newRecord(o, o.meta)
		r.Plugged = o.origin != OriginPeer
	}
	r.Metadata = o.meta
	r.Source = o.src.Where()
	if o.origin == OriginStick {
		r.Source = o.device
	}
	r.Dir = filepath.Join(m.cfg.ExtractDir, o.meta.DirName())
	m.active = r
	m.notice = ""
	effs = append(effs, m.move(r, PhaseDetected, Condition{}, Progress{Total: o.meta.SizeBytes, Unit: "bytes"})...)
	effs = append(effs, m.extract(r, o.src, o.device, o.medium, m.polFor(o.meta))...)
	keep = o.medium != 0
	reply(nil)
	return effs
}

// sameBundle reports whether an offer is the bundle act holds: the same
// digest, or for sources that tell none, the same name.
func (m *machine) sameBundle(o evOffer, act *Record) bool {
	return !o.differs && (o.digest != "" && o.digest == act.Digest ||
		o.digest == "" && act.Digest == "" && act.Name == o.src.Name())
}

// offerWhileHeld answers a bundle offered while another holds the node: the
// same one is noted, a different one is a conflict record.
func (m *machine) offerWhileHeld(o evOffer, act *Record, log *slog.Logger) []effect {
	if m.sameBundle(o, act) {
		log.Info("this bundle is already here; nothing to do", "phase", string(act.Phase))
		m.notice = fmt.Sprintf("%s on %s is the bundle already held (%s)", o.src.Name(), orFile(o.device), sha256digest.Short(act.Digest))
		return nil
	}
	reason := fmt.Sprintf("%s differs from the bundle this node already holds (%s, %s): remove this stick; run 'ferry cleanup' first to replace the bundle",
		o.src.Name(), act.Name, act.Phase)
	log.Warn("conflict: a second, different bundle", "reason", reason)
	r := m.newRecord(o, o.meta)
	m.lastBad = r
	return m.move(r, PhaseConflict, fault(ReasonBundlesDiffer, reason), Progress{})
}

func orFile(device string) string {
	if device == "" {
		return "the file given"
	}
	return device
}

// extract starts verifying and extracting r from src.
func (m *machine) extract(r *Record, src bundle.Source, device string, medium MediumID, pol bundle.Policy) []effect {
	m.log.Info("verifying and extracting", "phase", string(PhaseDetected), "bundle", r.Name, "device", device)
	effs := append(m.keepsDir(r.Dir), effRemove{r.Dir}) // never trust a dir whose extraction was not recorded
	effs = append(effs, m.startJob(effStartJob{kind: jobExtract, rec: r, src: src, policy: pol,
		pieces: r.Origin != OriginPeer}, device)...)
	m.job.medium = medium
	return effs
}

// newRecord makes a record with an ID it keeps for life.
func (m *machine) newRecord(o evOffer, meta *bundle.Metadata) *Record {
	base := strings.TrimSuffix(strings.TrimPrefix(o.src.Name(), "upgrade-"), ".tar")
	if meta != nil {
		base = meta.DirName()
	}
	r := &Record{Digest: o.digest, Name: o.src.Name(), Metadata: meta, Origin: o.origin, Source: o.src.Where()}
	r.ID = m.newID(base)
	return r
}

func (m *machine) newID(base string) string {
	id := base + "-" + m.now().UTC().Format("20060102T150405")
	for i := 2; m.records[id] != nil; i++ {
		id = base + "-" + m.now().UTC().Format("20060102T150405") + "-" + strconv.Itoa(i)
	}
	return id
}
