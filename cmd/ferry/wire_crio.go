package main

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/crio"
	"github.com/ferry-edge/ferry/systemd"
)

// crioLoader is the agent's Loader: the embedded registry and CRI-O.
type crioLoader struct {
	*crio.BundleLoader
	storageDir string
	floor      int64
}

// Load checks room in the container storage first.
func (l crioLoader) Load(ctx context.Context, meta *bundle.Metadata, dir string, keep []string, progress func(done, total int)) error {
	if _, err := os.Stat(l.storageDir); err == nil {
		if err := crio.CheckRoom(l.storageDir, meta.SizeBytes+l.floor); err != nil {
			return err
		}
	}
	return l.BundleLoader.Load(ctx, meta, dir, keep, progress)
}

// Resume brings the registry back for a loaded bundle; loading again is
// cheap (drop-ins unchanged, images present and pinned are skipped).
func (l crioLoader) Resume(ctx context.Context, meta *bundle.Metadata, dir string, keep []string) error {
	return l.BundleLoader.Load(ctx, meta, dir, keep, nil)
}

// newLoader wires CRI-O, or nothing when no CRI socket is configured.
func newLoader(cfg agent.Config, log *slog.Logger) (agent.Loader, error) {
	if cfg.CRIO.Socket == "" {
		return nil, nil
	}
	var rl crio.Reloader
	switch cfg.CRIO.Reload {
	case "systemd":
		rl = systemd.NewUnitReloader(cfg.CRIO.Unit)
	case "signal":
		rl = crio.SignalReloader{PidFile: cfg.CRIO.PidFile}
	default:
		rl = crio.NoReload{}
	}
	cl, err := crio.Dial(cfg.CRIO.Socket)
	if err != nil {
		return nil, err
	}
	return crioLoader{
		BundleLoader: &crio.BundleLoader{
			Loader: &crio.Loader{CRI: cl, Reloader: rl, Log: log, Workers: cfg.CRIO.PullWorkers,
				Dropins: &crio.Dropins{CRIOConfDir: cfg.Paths.CRIOConfDir, RegistriesConfDir: cfg.Paths.RegistriesConfDir, CertsDir: cfg.Paths.CertsDir}},
			RegistryStateDir: filepath.Join(cfg.Paths.StateDir, "registry"),
			RegistryPort:     cfg.Registry.Port,
			Log:              log,
		},
		storageDir: cfg.CRIO.StorageDir,
		floor:      cfg.CRIO.StorageFloorBytes,
	}, nil
}
