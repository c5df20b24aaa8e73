package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/cluster"
	"github.com/ferry-edge/ferry/internal/pacing"
	"github.com/spf13/cobra"
)

func newBundleInspectCmd() *cobra.Command {
	var o outputFlag
	c := &cobra.Command{
		Use:   "inspect [flags] PATH",
		Short: "print a bundle's metadata (reads only its first entry)",
		Args:  onePath("one PATH (a bundle tar or a block device)"),
		RunE: func(c *cobra.Command, args []string) error {
			return runBundleInspect(c.OutOrStdout(), args[0], o.format)
		},
	}
	o.add(c, outJSON, outYAML) // json, yaml: metadata.json
	return c
}

func runBundleInspect(w io.Writer, path, format string) error {
	m, err := bundle.InspectFile(path)
	if err != nil {
		return err
	}
	if isObject(format) {
		return writeObject(w, m, format)
	}
	tarSize := int64(-1)
	if fi, err := os.Stat(path); err == nil && fi.Mode().IsRegular() {
		tarSize = fi.Size()
	}
	_, err = io.WriteString(w, inspectText(m, tarSize))
	return err
}

// inspectText is what ferry bundle inspect prints of m; tarSize is the
// tar's length, -1 when unknown (a raw block device). A bundle made by
// other tools (seed-shaped) may give no size and no creation time: those
// read "unknown", not 0 bytes and year 1.
func inspectText(m *bundle.Metadata, tarSize int64) string {
	var b strings.Builder
	size := fmt.Sprintf("%d bytes", m.SizeBytes)
	switch {
	case m.SizeBytes <= 0 && tarSize >= 0:
		size = fmt.Sprintf("unknown (metadata.json gives none; the tar is %d bytes)", tarSize)
	case m.SizeBytes <= 0:
		size = "unknown (metadata.json gives none)"
	case m.Size != "":
		size = fmt.Sprintf("%s (%d bytes)", m.Size, m.SizeBytes)
	}
	created := "unknown (metadata.json gives none)"
	if !m.Created.IsZero() {
		created = m.Created.Format(time.RFC3339)
	}
	fmt.Fprintf(&b, "bundle:   %s\nversion:  %s\narch:     %s\nsize:     %s\nrelease:  %s\nimages:   %d (+ release)\ncreated:  %s\n",
		m.Name(), m.Version, m.Arch, size, m.Release, len(m.Images), created)
	if len(m.Path) > 0 {
		fmt.Fprintf(&b, "path:     %s (%d hops, taken one after another)\n", hopVersions(m.Hops()), len(m.Path))
		for i, h := range m.Hops() {
			fmt.Fprintf(&b, "  hop %d: %s %s (release signatures: %d)\n", i+1, h.Version, h.Release, len(h.ReleaseSignatures))
		}
	}
	fmt.Fprintf(&b, "shape:    %s\n", m.Shape)
	if len(m.Duplicates) > 0 {
		fmt.Fprintf(&b, "warning:  images listed more than once (counted once): %s\n", strings.Join(m.Duplicates, ", "))
	}
	if n := len(m.ReleaseSignatures); n > 0 {
		fmt.Fprintf(&b, "release signatures: %d\n", n)
	} else {
		fmt.Fprintf(&b, "release signatures: none (a disconnected cluster will refuse this release unless it can verify it otherwise)\n")
	}
	writeSigstore(&b, m)
	return b.String()
}

// trustOptions are the flags verify and extract share.
type trustOptions struct {
	sha256, arch   string
	approved, keys []string
	quiet          bool
}

func (t *trustOptions) addFlags(c *cobra.Command) {
	f := c.Flags()
	f.StringVar(&t.sha256, "sha256", "", "sha256sum file (default: <bundle>.sha256 next to the tar)")
	f.StringVar(&t.arch, "arch", "", "refuse bundles for another arch (uname -m name, e.g. x86_64)")
	f.BoolVar(&t.quiet, "quiet", false, "no progress output")
	f.StringArrayVar(&t.approved, "approved-digest", nil, "approved bundle digest (sha256:<hex>), repeatable")
	f.StringArrayVar(&t.keys, "trusted-key", nil, "minisign public key file, repeatable")
	c.RegisterFlagCompletionFunc("arch", choices(archs...))
	c.RegisterFlagCompletionFunc("approved-digest", cobra.NoFileCompletions)
}

func (t *trustOptions) options(log *slog.Logger, stderr io.Writer) (bundle.Options, error) {
	for _, d := range t.approved {
		if bundle.NormalizeDigest(d) == "" {
			return bundle.Options{}, usageError("--approved-digest %q is not a sha256 digest", d)
		}
	}
	keys, err := bundle.LoadTrustedKeys(t.keys)
	if err != nil {
		return bundle.Options{}, usageError("%v", err)
	}
	o := bundle.Options{Policy: bundle.Policy{Arch: t.arch, ApprovedDigests: t.approved, TrustedKeys: keys}, Log: log}
	if !t.quiet {
		o.Progress = progressPrinter(stderr, "verifying")
	}
	return o, nil
}

func newBundleVerifyCmd() *cobra.Command {
	t := &trustOptions{}
	c := &cobra.Command{
		Use:   "verify [flags] PATH",
		Short: "check a bundle's format, arch, approval and sha256",
		Args:  onePath("one PATH"),
		RunE: func(c *cobra.Command, args []string) error {
			return runBundleVerify(c.Context(), c.OutOrStdout(), c.ErrOrStderr(), args[0], t)
		},
	}
	t.addFlags(c)
	return c
}

func runBundleVerify(ctx context.Context, w, stderr io.Writer, path string, t *trustOptions) error {
	opts, err := t.options(cliLogger(stderr), stderr)
	if err != nil {
		return err
	}
	src, err := bundle.FindSource(path, t.sha256)
	if err != nil {
		return err
	}
	opts.SpaceFactor = -1
	res, err := bundle.Verify(ctx, src, opts)
	endProgress(stderr, opts.Progress)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "OK %s %s (%s, %s, approval: %s)\n", src.Name(), res.Digest, res.Metadata.Version, res.Metadata.Arch, approvalText(res.Approval))
	for _, h := range res.Metadata.Hops() {
		fmt.Fprint(w, releaseApprovalText(h.Release))
	}
	return nil
}

// approvalText is the approval verify found. With no --approved-digest
// or --trusted-key (the engineer's workstation) nothing was checked: each
// node checks its own policy and the cluster's UpgradeBundle, so "off"
// would read as if the nodes took any bundle.
func approvalText(a bundle.Approval) string {
	if a == bundle.ApprovalOff {
		return "not checked here (no --approved-digest or --trusted-key); the cluster approves this digest in its UpgradeBundle (spec.approvedDigest)"
	}
	return string(a)
}

// releaseApprovalText is how the administrator approves the bundle's
// release for the cluster upgrade (packaging/admission.yaml refuses it
// until then), "" for a release not named by digest.
func releaseApprovalText(release string) string {
	cmd := cluster.ApproveCommand(release)
	if cmd == "" {
		return ""
	}
	return fmt.Sprintf("the cluster upgrade to release %s needs the administrator's approval, once:\n  %s\n", release, cmd)
}

type extractOptions struct {
	trustOptions
	dest, pacing string
	sync         bool
}

func newBundleExtractCmd() *cobra.Command {
	o := &extractOptions{}
	c := &cobra.Command{
		Use:   "extract [flags] PATH --dest DIR",
		Short: "verify a bundle and extract it in one pass",
		Args:  onePath("one PATH and --dest DIR"),
		RunE: func(c *cobra.Command, args []string) error {
			return runBundleExtract(c.Context(), c.OutOrStdout(), c.ErrOrStderr(), args[0], o)
		},
	}
	o.addFlags(c)
	f := c.Flags()
	f.StringVar(&o.dest, "dest", "", "directory to create with the extracted bundle (must not exist)")
	f.BoolVar(&o.sync, "sync", false, "flush the extracted files to disk before the directory appears")
	f.StringVar(&o.pacing, "pacing", pacing.DefaultPoliteness, "hold back while the node's other work stalls (pressure stall information): "+strings.Join(pacing.Politeness(), ", ")+" or off")
	c.MarkFlagDirname("dest")
	c.RegisterFlagCompletionFunc("pacing", choices(append(pacing.Politeness(), "off")...))
	return c
}

func runBundleExtract(ctx context.Context, w, stderr io.Writer, path string, o *extractOptions) error {
	if o.dest == "" {
		return usageError("want one PATH and --dest DIR")
	}
	opts, err := o.options(cliLogger(stderr), stderr)
	if err != nil {
		return err
	}
	opts.Sync = o.sync
	if o.pacing != "off" {
		lim, ok := pacing.LimitsFor(o.pacing)
		if !ok {
			return usageError("--pacing %q is not one of %s or off", o.pacing, strings.Join(pacing.Politeness(), ", "))
		}
		gov := pacing.New(pacing.NewPSI(pacing.WatchDir("")), lim, 0, cliLogger(stderr)) // as the agent: the pods' pressure, else the node's
		pctx, stop := context.WithCancel(ctx)
		defer stop()
		go gov.Run(pctx)
		opts.Pacer = gov
	}
	src, err := bundle.FindSource(path, o.sha256)
	if err != nil {
		return err
	}
	res, err := bundle.Extract(ctx, src, o.dest, opts)
	endProgress(stderr, opts.Progress)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "OK %s %s extracted to %s\n", src.Name(), res.Digest, o.dest)
	return nil
}

func cliLogger(stderr io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// progressPrinter shows progress on w when it is a terminal, at most
// every 200 ms.
func progressPrinter(w io.Writer, verb string) func(done, total int64) {
	if !isTerminal(w) {
		return nil
	}
	start, last := time.Now(), time.Time{}
	return func(done, total int64) {
		if time.Since(last) < 200*time.Millisecond && done < total {
			return
		}
		last = time.Now()
		rate := float64(done) / max(time.Since(start).Seconds(), 0.001)
		pct := 0.0
		if total > 0 {
			pct = 100 * float64(done) / float64(total)
		}
		fmt.Fprintf(w, "\r%s: %3.0f%% (%s/%s) %s/s   ", verb, pct, bundle.HumanSize(done), bundle.HumanSize(total), bundle.HumanSize(int64(rate)))
	}
}

func endProgress(w io.Writer, p func(int64, int64)) {
	if p != nil {
		fmt.Fprintln(w)
	}
}

// isTerminal: w is a terminal (a test's buffer, a pipe or a file is not).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// writeSigstore lists the sigstore attachments the bundle carries and says
// whether the release's is among them.
func writeSigstore(w io.Writer, m *bundle.Metadata) {
	name, _, d := bundle.SplitRef(m.Release)
	signed := slices.ContainsFunc(m.Signatures, func(s string) bool { return m.SignatureOf(s) == name+"@"+d })
	switch {
	case len(m.Signatures) == 0:
		fmt.Fprintf(w, "sigstore signatures: none (OpenShift 4.21+ nodes require one for the release: make the bundle again with a ferry that copies them)\n")
		return
	case signed:
		fmt.Fprintf(w, "sigstore signatures: %d (the release's included)\n", len(m.Signatures))
	default:
		fmt.Fprintf(w, "sigstore signatures: %d (none for the release: OpenShift 4.21+ nodes will refuse it)\n", len(m.Signatures))
	}
	for _, s := range m.Signatures {
		fmt.Fprintf(w, "  %s\n", s)
	}
}
