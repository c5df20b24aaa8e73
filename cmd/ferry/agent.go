package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/ferry-edge/ferry/imagepolicy"
	"github.com/ferry-edge/ferry/localapi"

	"github.com/BurntSushi/toml"
	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/crio"
	"github.com/ferry-edge/ferry/media"
	"github.com/ferry-edge/ferry/metrics"
	"github.com/ferry-edge/ferry/pull"
	"github.com/ferry-edge/ferry/systemd"
	"github.com/ferry-edge/ferry/udev"
)

// nodeOptions are the flags of the commands that read the agent's config.
type nodeOptions struct{ config string }

// nodeCmd is a command that reads the agent's config, then does act,
// which prints to the command's stdout (w). With path it takes one
// bundle PATH, else no argument.
func nodeCmd(use, short string, path bool, o *nodeOptions, act func(context.Context, io.Writer, agent.Config, []string) error) *cobra.Command {
	c := &cobra.Command{
		Use:   use,
		Short: short,
		RunE: func(c *cobra.Command, args []string) error {
			cfg, err := loadConfig(o.config)
			if err != nil {
				return err
			}
			return act(c.Context(), c.OutOrStdout(), cfg, args)
		},
	}
	if path {
		c.Args = onePath("one bundle PATH")
	} else {
		c.Args, c.ValidArgsFunction = noArgs, cobra.NoFileCompletions
	}
	c.Flags().StringVar(&o.config, "config", "", "config file (default "+agent.DefaultConfigPath+", optional)")
	c.MarkFlagFilename("config", "toml")
	return c
}

func newAgentCmd() *cobra.Command {
	return nodeCmd("agent", "run the node agent (the systemd service)", false, &nodeOptions{},
		func(ctx context.Context, _ io.Writer, cfg agent.Config, _ []string) error { return runAgent(ctx, cfg) })
}

type configCheckOptions struct {
	nodeOptions
	output outputFlag
}

func newConfigCheckCmd() *cobra.Command {
	o := &configCheckOptions{}
	c := nodeCmd("check", "validate a config file and print the effective config", false, &o.nodeOptions,
		func(_ context.Context, w io.Writer, cfg agent.Config, _ []string) error {
			return writeConfig(w, cfg, o.output.format)
		})
	o.output.add(c, outJSON, outYAML)
	return c
}

// writeConfig prints the effective config as TOML, the config file's own
// form, or in format: the same keys (the TOML's, node_name…), sorted.
func writeConfig(w io.Writer, cfg agent.Config, format string) error {
	if !isObject(format) {
		return agent.WriteConfig(w, cfg)
	}
	var b bytes.Buffer
	if err := agent.WriteConfig(&b, cfg); err != nil {
		return err
	}
	var m map[string]any
	if _, err := toml.Decode(b.String(), &m); err != nil {
		return err
	}
	return writeObject(w, m, format)
}

type loadOptions struct {
	nodeOptions
	release string
	extras  []string
}

func newLoadCmd() *cobra.Command {
	o := &loadOptions{}
	c := nodeCmd("load [flags] PATH | --release REF [--extra-image REF]...", "give the agent a bundle file instead of a stick, or have it pull a release from the site's registry", true, &o.nodeOptions,
		func(ctx context.Context, w io.Writer, cfg agent.Config, args []string) error {
			return runLoad(ctx, w, cfg, o, args)
		})
	c.Args = func(c *cobra.Command, args []string) error {
		if o.release != "" {
			return noArgs(c, args)
		}
		if len(o.extras) > 0 {
			return usageError("--extra-image goes with --release")
		}
		return onePath("one bundle PATH, or --release")(c, args)
	}
	c.Flags().StringVar(&o.release, "release", "", "pull this release (NAME@sha256:…) from the registry the node's registries.conf reaches, make a bundle of it on this node and load it (registry mode)")
	c.Flags().StringArrayVar(&o.extras, "extra-image", nil, "with --release: an image to pull too (by tag or digest; repeatable)")
	return c
}

func newCleanupCmd() *cobra.Command {
	return nodeCmd("cleanup", "the upgrade is done: remove the bundle's files, registry and mirror (pins stay until the next upgrade); before loading: take the bundle out", false, &nodeOptions{}, runCleanup)
}

func newProceedCmd() *cobra.Command {
	return nodeCmd("proceed", "start the cluster upgrade now (schedule = \"Manual\"), or run a failed on_ready hook again", false, &nodeOptions{}, runProceed)
}

// loadConfig reads --config (explicit) or the default path; a bad config
// is a usage error.
func loadConfig(path string) (agent.Config, error) {
	explicit := path != ""
	if !explicit {
		path = agent.DefaultConfigPath
	}
	c, err := agent.LoadConfig(path, explicit)
	if err != nil {
		return c, usageErr{err}
	}
	return c, nil
}

func runAgent(ctx context.Context, cfg agent.Config) error {
	log := systemd.NewLogger(nil)
	sticks := &media.Media{MountDir: cfg.Paths.MountDir, AllowDevices: cfg.Media.AllowDevices, ExtraFilesystems: cfg.Media.ExtraFilesystems, Log: log}
	if err := sticks.Sweep(); err != nil { // mounts a crashed agent left behind
		log.Warn("cleaning the mount dir", "err", err)
	}
	// What the agent does, as metrics, served on the peer port.
	m := metrics.New()
	deps := agent.Deps{Notify: notifier{}, Log: log, Admit: imagepolicy.Checker{Path: cfg.Paths.SignaturePolicy}.Admit, Published: m.Observe}
	// One governor paces all bulk work: extraction, peers, pulls.
	gov, runPacer := agent.NewPacer(cfg.Pacing, log)
	if gov != nil {
		deps.Pacer = gov
	}
	if cfg.Media.Automatic() {
		deps.Devices, deps.Media = udevSource{udev.NewMonitor(log)}, mediaOpener{sticks}
	} else {
		log.Info("media.detect is manual: plugged devices are not read; give bundles with ferry load")
	}
	loader, err := newLoader(cfg, gov, m, log)
	if err != nil {
		return err
	}
	if loader != nil {
		deps.Loader = m.Loader(loader)
	}
	var followCluster func(context.Context) error
	if deps.API, deps.Warnings, followCluster, err = newClusterAPI(&cfg, m, log); err != nil {
		return err
	}
	peers, err := newPeers(cfg, gov, recordedNodes(deps.API), m, log)
	if err != nil {
		return err
	}
	var access *pull.PeerAccess
	if peers != nil {
		deps.Peers, access = peers.peers, peers.access
	}
	puller, setAgent, err := newPuller(cfg, deps.Loader, access, log)
	if err != nil {
		return err
	}
	deps.Puller = puller
	a, err := agent.New(cfg, deps)
	if err != nil {
		return usageErr{err}
	}
	setAgent(a)
	g, ctx := errgroup.WithContext(ctx)
	if peers != nil && peers.serve != nil {
		g.Go(func() error { return peers.serve(ctx, a, puller.Handler()) })
	}
	if loader != nil {
		g.Go(func() error { return loader.Run(ctx) })
		// ferry's drop-ins follow the node's own (the MCO's pins, IDMS).
		if rt, ok := loader.Runtime.(*crio.Runtime); ok {
			g.Go(func() error { return rt.WatchConf(ctx) })
		}
	}
	if runPacer != nil {
		g.Go(func() error { return runPacer(ctx) })
	}
	if followCluster != nil {
		g.Go(func() error { return followCluster(ctx) })
	}
	g.Go(func() error { return puller.Run(ctx) })
	g.Go(func() error { return localapi.Serve(ctx, cfg.Paths.Socket, a, log) })
	g.Go(func() error { return systemd.Watchdog(ctx, a.Alive, log) })
	g.Go(func() error { return a.Run(ctx) })
	err = g.Wait()
	systemd.Stopping()
	return err
}

type notifier struct{}

func (notifier) Ready()             { systemd.Ready() }
func (notifier) Status(line string) { systemd.Status("%s", line) }

func runLoad(ctx context.Context, w io.Writer, cfg agent.Config, o *loadOptions, args []string) error {
	if o.release != "" {
		req := pull.Request{Release: o.release, Extras: o.extras}
		if err := pull.Check(req); err != nil {
			return usageError("%v", err)
		}
		s, err := localapi.NewClient(cfg.Paths.Socket).Pull(ctx, req)
		if err != nil {
			return err
		}
		fmt.Fprintln(w, s.Line)
		return nil
	}
	path, err := absPath(args[0])
	if err != nil {
		return err
	}
	s, err := localapi.NewClient(cfg.Paths.Socket).Load(ctx, path)
	if err != nil {
		return err
	}
	fmt.Fprintln(w, s.Line)
	return nil
}

func runCleanup(ctx context.Context, w io.Writer, cfg agent.Config, _ []string) error {
	s, err := localapi.NewClient(cfg.Paths.Socket).Do(ctx, "cleanup")
	if err != nil {
		return err
	}
	fmt.Fprintln(w, s.Line)
	return nil
}

func absPath(p string) (string, error) {
	if strings.HasPrefix(p, "/") {
		return p, nil
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", errors.New("cannot resolve a relative path")
	}
	return wd + "/" + p, nil
}

func runProceed(ctx context.Context, w io.Writer, cfg agent.Config, _ []string) error {
	if _, err := localapi.NewClient(cfg.Paths.Socket).Do(ctx, "proceed"); err != nil {
		return err
	}
	fmt.Fprintln(w, "proceeding: the upgrade is asked for through the API when a kubeconfig is set, then the on_ready hook runs (its output: journalctl -u ferry HOOK=on_ready); follow it with 'ferry status'")
	return nil
}
