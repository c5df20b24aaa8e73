package machine

import (
	"errors"
	"strconv"
	"strings"

	"github.com/ferry-edge/ferry/bundle/meta"
	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/internal/sha256digest"
)

// Transitions of sticks and files: a device plugged or pulled (evDevice),
// a probe's offer (evOffer), and the extraction it starts.

func (m *Machine) device(ev DeviceEvent) []Effect {
	if ev.Action == "remove" {
		if m.Job != nil && m.Job.device == ev.Device {
			m.log.Warn("the stick was pulled while it was being read", "device", ev.Device)
			return []Effect{EffStopJob{}}
		}
		return nil
	}
	if !m.hasMedia || m.probing[ev.Device] || m.Job != nil && m.Job.device == ev.Device {
		return nil // a change event for a stick already being looked at
	}
	m.probing[ev.Device] = true
	var held digest.Digest
	if m.Active != nil {
		held = m.Active.Digest
	}
	return []Effect{EffProbe{Origin: OriginStick, Ev: ev, Held: held}}
}

// offer decides what to do with a bundle a probe found. Its medium is
// closed unless an extraction keeps it: effs is named so that the
// deferred close reaches the caller.
func (m *Machine) offer(o EvOffer) (effs []Effect) {
	delete(m.probing, o.Device)
	log := withLog(m.log, "device", o.Device)
	keep := false
	defer func() {
		if o.Medium != 0 && !keep {
			effs = append(effs, EffCloseMedium{o.Medium})
		}
	}()
	reply := func(err error) {
		if o.Reply != 0 {
			effs = append(effs, EffReply{o.Reply, err})
		}
	}
	switch {
	case o.NoBundle:
		log.Debug("not an upgrade stick", "err", o.Err)
		reply(o.Err)
		return effs
	case o.Meta == nil:
		effs = append(effs, m.reject(m.newRecord(o, nil), o.Err)...)
		reply(nil)
		return effs
	}
	log = withLog(log, "bundle", o.Src.Name())
	if act := m.Active; act != nil && !(m.sameBundle(o, act) && act.Phase == PhaseDetected && m.Job == nil) {
		effs = append(effs, m.offerWhileHeld(o, act, log)...)
		reply(nil)
		return effs
	}
	if m.Active != nil {
		log.Info("resuming the copy of this bundle")
	}
	if m.Job != nil {
		reply(errors.New("busy (" + string(m.Job.Kind) + "); try again when it is done"))
		return effs
	}
	r := m.Active
	if r == nil {
		r = m.newRecord(o, o.Meta)
		r.Plugged = o.Origin != OriginPeer
	}
	r.Metadata = o.Meta
	r.Source = o.Src.Where()
	if o.Origin == OriginStick {
		r.Source = o.Device
	}
	r.Dir = join(m.cfg.ExtractDir, o.Meta.DirName())
	m.Active = r
	m.notice = ""
	effs = append(effs, m.Move(r, PhaseDetected, Condition{}, Progress{Total: o.Meta.SizeBytes, Unit: "bytes"})...)
	effs = append(effs, m.extract(r, o.Src, o.Device, o.Medium, m.polFor(o.Meta))...)
	keep = o.Medium != 0
	reply(nil)
	return effs
}

// sameBundle reports whether an offer is the bundle act holds: the same
// digest, or for sources that tell none, the same name.
func (m *Machine) sameBundle(o EvOffer, act *Record) bool {
	return !o.Differs && (o.Digest != "" && o.Digest == act.Digest ||
		o.Digest == "" && act.Digest == "" && act.Name == o.Src.Name())
}

// offerWhileHeld answers a bundle offered while another holds the node: the
// same one is noted, a different one is a conflict record.
func (m *Machine) offerWhileHeld(o EvOffer, act *Record, log Logger) []Effect {
	if m.sameBundle(o, act) {
		log.Info("this bundle is already here; nothing to do", "phase", string(act.Phase))
		m.notice = o.Src.Name() + " on " + orFile(o.Device) + " is the bundle already held (" + sha256digest.Short(act.Digest) + ")"
		return nil
	}
	reason := o.Src.Name() + " differs from the bundle this node already holds (" + act.Name + ", " + string(act.Phase) +
		"): remove this stick; run 'ferry cleanup' first to replace the bundle"
	log.Warn("conflict: a second, different bundle", "reason", reason)
	r := m.newRecord(o, o.Meta)
	m.LastBad = r
	return m.Move(r, PhaseConflict, Fault(ReasonBundlesDiffer, reason), Progress{})
}

func orFile(device string) string {
	if device == "" {
		return "the file given"
	}
	return device
}

// extract starts verifying and extracting r from src.
func (m *Machine) extract(r *Record, src meta.Source, device string, medium MediumID, pol meta.Policy) []Effect {
	m.log.Info("verifying and extracting", "phase", string(PhaseDetected), "bundle", r.Name, "device", device)
	effs := append(m.keepsDir(r.Dir), EffRemove{r.Dir}) // never trust a dir whose extraction was not recorded
	effs = append(effs, m.startJob(EffStartJob{Kind: JobExtract, Rec: r, Src: src, Policy: pol,
		Pieces: r.Origin != OriginPeer}, device)...)
	m.Job.medium = medium
	return effs
}

// newRecord makes a record with an ID it keeps for life.
func (m *Machine) newRecord(o EvOffer, md *meta.Metadata) *Record {
	base := strings.TrimSuffix(strings.TrimPrefix(o.Src.Name(), "upgrade-"), ".tar")
	if md != nil {
		base = md.DirName()
	}
	r := &Record{Digest: o.Digest, Name: o.Src.Name(), Metadata: md, Origin: o.Origin, Source: o.Src.Where()}
	r.ID = m.newID(base)
	return r
}

func (m *Machine) newID(base string) string {
	id := base + "-" + m.Now().UTC().Format("20060102T150405")
	for i := 2; m.Records[id] != nil; i++ {
		id = base + "-" + m.Now().UTC().Format("20060102T150405") + "-" + strconv.Itoa(i)
	}
	return id
}
