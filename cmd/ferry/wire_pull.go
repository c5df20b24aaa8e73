package main

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/bundle/create"
	"github.com/ferry-edge/ferry/crio"
	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/pull"
)

// newPuller is registry mode's puller: it fetches through the node's own
// registries configuration (ferry's drop-in left out), trusting certs_dir,
// and hands what it made to a through the returned setter. It follows
// another node's pull through peers (nil: no peer).
func newPuller(cfg agent.Config, loader agent.Loader, peers *pull.PeerAccess, log *slog.Logger) (*pull.Puller, func(*agent.Agent), error) {
	window, err := pull.ParseWindow(cfg.Pull.Window)
	if err != nil {
		return nil, nil, err
	}
	var rate int64
	if cfg.Pull.RateLimit != "" {
		if rate, err = bundle.ParseSize(cfg.Pull.RateLimit); err != nil {
			return nil, nil, err
		}
	}
	// Trust the node's certs.d as CRI-O does; a node may have none.
	transport := func() (http.RoundTripper, error) {
		dir := cfg.Paths.CertsDir
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			dir = ""
		}
		return create.NewTransport(dir, true)
	}
	site := &crio.Dropins{RegistriesConfDir: cfg.Paths.RegistriesConfDir}
	var a *agent.Agent
	dir := filepath.Join(cfg.Paths.StateDir, "pull")
	var room func(*bundle.Metadata, int64, int64) error
	if loader != nil {
		// The room a stick's bundle needs (extracted, loaded), and the
		// pull's tar: at its peak the node holds the tar and the
		// extracted tree (the work tree goes once the tar is written).
		room = func(meta *bundle.Metadata, _, total int64) error {
			return loader.CheckRoomBefore(context.Background(), meta,
				map[string]int64{dir: total, cfg.Paths.ExtractDir: total})
		}
	}
	p, err := pull.New(pull.Options{
		Dir:       dir,
		CheckRoom: room,
		Arch:      cfg.Arch,
		Mirrors: func() ([]create.Mirror, error) {
			s, err := site.SiteRegistries()
			if err != nil {
				return nil, err
			}
			var ms []create.Mirror
			for _, src := range s.PullSources() {
				ms = append(ms, create.Mirror{Prefix: src.Prefix, Location: src.Location, Insecure: src.Insecure,
					DigestOnly: src.DigestOnly, TagOnly: src.TagOnly, Blocked: src.Blocked})
			}
			return ms, nil
		},
		Transport: transport, PullSecret: cfg.Pull.PullSecret, RateLimit: rate, Window: window,
		SignatureStore: cfg.Pull.SignatureStore,
		Deliver: func(ctx context.Context, res *create.Result) error {
			return a.RequestPulled(ctx, pulledBundle{res}, res.Digest)
		},
		Delivered: func(d digest.Digest) (bool, error) { return delivered(a.Status(), d) },
		Peers:     peers,
		Log:       log,
	})
	return p, func(ag *agent.Agent) { a = ag }, err
}

// delivered reads the agent's status for the bundle made with digest:
// held once verified and extracted, an error when it refused it.
func delivered(s agent.Status, d digest.Digest) (bool, error) {
	for _, r := range s.Bundles {
		if r.Digest != d {
			continue
		}
		if r.Origin == agent.OriginPeer && r.Phase == agent.PhaseRejected && r.Dir == "" {
			// The same bundle offered by a peer before the puller
			// published it, refused unfetched: nothing about this one.
			continue
		}
		switch r.Phase {
		case agent.PhaseRejected, agent.PhaseFailed:
			return false, errors.New(r.Condition.Message)
		case agent.PhaseDetected, agent.PhaseFetching:
			return false, nil
		}
		return true, nil
	}
	return false, nil
}

// pulledBundle is a bundle the puller made, as the agent takes a file
// given to ferry load; its files are the puller's own.
type pulledBundle struct{ res *create.Result }

func (p pulledBundle) Bundles() []bundle.Source {
	return []bundle.Source{{Path: p.res.TarPath, SHA256Path: p.res.SHA256Path}}
}

func (pulledBundle) Close() error { return nil }
