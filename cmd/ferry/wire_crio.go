package main

import (
	"log/slog"
	"path/filepath"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/crio"
	"github.com/ferry-edge/ferry/internal/pacing"
	"github.com/ferry-edge/ferry/load"
	"github.com/ferry-edge/ferry/metrics"
	"github.com/ferry-edge/ferry/registry"
	"github.com/ferry-edge/ferry/systemd"
)

// The agent's Loader is load's, on the embedded registry, CRI-O
// (crio.Runtime) and its image store (load.ImageStore).
var _ agent.Loader = (*load.Loader)(nil)

// newLoader wires the embedded registry and CRI-O, or nothing when no CRI
// socket is configured.
func newLoader(cfg agent.Config, gov *pacing.Governor, m *metrics.Metrics, log *slog.Logger) (*load.Loader, error) {
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
	rl = m.Reloader(rl)
	cl, err := crio.Dial(cfg.CRIO.Socket)
	if err != nil {
		return nil, err
	}
	regDir := filepath.Join(cfg.Paths.StateDir, "registry")
	var pacer crio.Pacer
	if gov != nil {
		pacer = gov
	}
	return &load.Loader{
		OpenRegistry: func() (load.BundleServer, error) {
			reg, err := registry.New(regDir, cfg.Registry.Port, log)
			if err == nil && gov != nil {
				reg.Pacer = gov
			}
			if err == nil {
				reg.Served = m.ServedAs(metrics.SourceRegistry)
			}
			return reg, err
		},
		Runtime: &crio.Runtime{CRI: cl, Reloader: rl, Log: log, Workers: cfg.CRIO.PullWorkers, Pacer: pacer,
			Dropins: &crio.Dropins{CRIOConfDir: cfg.Paths.CRIOConfDir, RegistriesConfDir: cfg.Paths.RegistriesConfDir, CertsDir: cfg.Paths.CertsDir,
				RegistriesD: cfg.Paths.RegistriesD, Ledger: filepath.Join(cfg.Paths.StateDir, crio.LedgerName)}},
		Store:     load.ImageStore{Dir: cfg.CRIO.StorageDir, KubeletConfig: cfg.CRIO.KubeletConfig, Log: log},
		RoomFloor: cfg.CRIO.StorageFloorBytes,
		Log:       log,
	}, nil
}
