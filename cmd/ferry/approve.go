package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/ferry-edge/ferry/approve"
	"github.com/ferry-edge/ferry/internal/sha256digest"
	"github.com/ferry-edge/ferry/kube"
)

// approveFlags are ferry approve's flags.
type approveFlags struct {
	bundle, schedule, kubeconfig string
	out                          outputFlag
}

func newApproveCmd() *cobra.Command {
	var f approveFlags
	c := &cobra.Command{
		Use:   "approve [flags] FILE.sha256",
		Short: "approve a bundle in the cluster before the stick arrives (the administrator's kubeconfig)",
		Args:  onePath("one FILE.sha256 (the engineer's upgrade-<version>-<arch>.sha256)"),
		RunE: func(c *cobra.Command, args []string) error {
			return runApprove(c.Context(), c.OutOrStdout(), args[0], f, adminAPI)
		},
	}
	c.Flags().StringVar(&f.bundle, "bundle", "", "the bundle tar, to read its release (default: the tar the .sha256 names, if it sits beside it)")
	c.Flags().StringVar(&f.schedule, "schedule", "", "also set spec.schedule: Automatic or Manual (default: leave it)")
	c.Flags().StringVar(&f.kubeconfig, "kubeconfig", "", "the administrator's kubeconfig (default: $KUBECONFIG, else ~/.kube/config)")
	c.RegisterFlagCompletionFunc("schedule", choices(approve.Schedules...))
	f.out.add(c, outJSON, outYAML)
	return c
}

// adminAPI is the cluster's API with the administrator's kubeconfig.
func adminAPI(kubeconfig string) (approve.API, error) {
	path, err := approve.Kubeconfig(kubeconfig)
	if err != nil {
		return nil, usageError("%v", err)
	}
	c, err := kube.New(path, nil)
	if err != nil {
		return nil, usageError("%v", err)
	}
	return c, nil
}

func runApprove(ctx context.Context, w io.Writer, sha256File string, f approveFlags, api func(string) (approve.API, error)) error {
	p, err := approve.Read(sha256File, f.bundle, f.schedule)
	if err != nil {
		return usageError("%v", err)
	}
	a, err := api(f.kubeconfig)
	if err != nil {
		return err
	}
	res, err := approve.Apply(ctx, a, p)
	if err != nil {
		return err
	}
	if isObject(f.out.format) {
		return writeObject(w, res, f.out.format)
	}
	_, err = io.WriteString(w, approveText(res))
	return err
}

// approveText is what ferry approve prints of res.
func approveText(res approve.Result) string {
	var b strings.Builder
	p := res.Plan
	fmt.Fprintf(&b, "upgradebundle %s %s: approvedDigest %s", p.Name, res.UpgradeBundle, p.Digest)
	if p.Schedule != "" {
		fmt.Fprintf(&b, ", schedule %s", p.Schedule)
	}
	b.WriteString("\n")
	if res.Replaced != "" {
		fmt.Fprintf(&b, "  it approved %s before: that bundle no longer loads\n", sha256digest.Short(res.Replaced))
	}
	if res.ReleaseKey != "" {
		fmt.Fprintf(&b, "release %s %s (ConfigMap %s/%s, key %s)\n", p.Release, res.Release, kube.AdmissionNamespace, kube.AdmissionConfigMap, res.ReleaseKey)
	}
	for _, stray := range res.Strays {
		fmt.Fprintf(&b, "note: upgradebundle %s approves this digest too but counts for nothing (only %s does): delete it (oc delete upgradebundle %s)\n", stray, p.Name, stray)
	}
	if res.Needed != "" {
		fmt.Fprintf(&b, "not done: %s\n", res.Needed)
	}
	fmt.Fprintf(&b, "next: plug the stick into any node, if no node has it yet; follow it with\n  kubectl wait --for=condition=Approved upgradebundle/%s --timeout=30m\n  oc get upgradebundle %s -o wide\n", p.Name, p.Name)
	return b.String()
}
