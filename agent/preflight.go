package agent

import (
	"context"
	"fmt"
	"github.com/ferry-edge/ferry/agent/machine"
	"strings"
	"time"
)

// preflightTimeout bounds the preflight's API calls: a cluster API that
// does not answer does not hold up the stick.
const preflightTimeout = 30 * time.Second

// preflight asks the cluster, before a plugged bundle is read and
// shared, whether it can take the upgrade: a refusal ends the job
// (ErrPreflight, the bundle is rejected); warnings go to the record, a
// refused bundle's too, so that the technician learns of every finding
// on the one visit. An API that cannot be asked is a warning too: ferry
// works without one.
func (a *Agent) preflight(ctx context.Context, r *machine.Record) error {
	if a.deps.API == nil || r.Metadata == nil {
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, preflightTimeout)
	p, err := a.preflightOf(cctx, r)
	cancel()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err != nil {
		a.log.Warn("the cluster's preflight could not run; going on without it", "bundle", r.Name, "err", err)
		a.post(machine.EvPreflight{ID: r.ID, Warnings: []string{fmt.Sprintf("the cluster's preflight could not run: %v", err)}})
		return nil
	}
	for _, w := range p.Warnings {
		a.log.Warn("preflight", "bundle", r.Name, "warning", w)
	}
	// Named here only: the warnings go into the cluster-scoped
	// UpgradeBundle, these (a tenant's pods) stay in the node's journal.
	for _, d := range p.Details {
		a.log.Warn("preflight: a workload the bundle does not carry", "bundle", r.Name, "container", d)
	}
	// Posted before the job ends: the refusal (the job's end, posted
	// after this returns) finds the warnings on the record.
	a.post(machine.EvPreflight{ID: r.ID, Warnings: p.Warnings})
	if len(p.Refusals) > 0 {
		a.log.Error("the cluster cannot take this upgrade", "bundle", r.Name, "current", p.Current, "refusals", p.Refusals, "warnings", len(p.Warnings))
		return fmt.Errorf("%w: %s", machine.ErrPreflight, strings.Join(p.Refusals, "; "))
	}
	a.log.Info("the cluster's preflight passed", "bundle", r.Name, "current", p.Current, "target", r.Metadata.Version, "warnings", len(p.Warnings))
	return nil
}
