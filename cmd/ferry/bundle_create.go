package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/bundle/create"
	"github.com/ferry-edge/ferry/hop"
	"github.com/spf13/cobra"
)

// createOptions are the flags of bundle create.
type createOptions struct {
	version, arch, extraFile, pullSecret, certDir, output, signKey string
	platforms, signatures, workDir, sigStore, rateLimit            string
	tlsVerify, keepWork, quiet                                     bool
	jobs                                                           int
	releases, extras, mirrors, sigFiles                            []string
}

func newBundleCreateCmd() *cobra.Command {
	o := &createOptions{}
	c := &cobra.Command{
		Use:               "create [flags]",
		Short:             "copy a release and extra images into an upgrade bundle (connected side)",
		Args:              noArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(c *cobra.Command, _ []string) error {
			return runBundleCreate(c.Context(), c.OutOrStdout(), c.ErrOrStderr(), o)
		},
	}
	f := c.Flags()
	f.StringArrayVar(&o.releases, "release", nil, "release image (e.g. quay.io/openshift-release-dev/ocp-release:4.13.7-x86_64 or …@sha256:…), or a version (4.13.7: its image for --arch); default: that of --version and --arch. Repeat it for a path (an EUS-to-EUS update: --release 4.17.20 --release 4.18.10): one bundle holds every release, the cluster takes them one after another in version order")
	f.StringVar(&o.version, "version", "", "bundle version (default: the release image's release-metadata)")
	f.StringVar(&o.arch, "arch", "", "x86_64, aarch64, ppc64le or s390x (default: the release image's architecture)")
	f.StringVar(&o.extraFile, "extra-images-file", "", "file of extra images, one a line (# comments, blank lines ignored)")
	f.StringVar(&o.pullSecret, "pull-secret", "", "registry credentials: a pull secret or auth.json ({\"auths\": {...}})")
	f.StringVar(&o.certDir, "cert-dir", "", "certs.d-style directory of registry CAs: <dir>/<host[:port]>/ca.crt")
	f.BoolVar(&o.tlsVerify, "tls-verify", true, "verify registries' TLS certificates (false also allows plain HTTP)")
	f.StringVar(&o.output, "output", ".", "directory for upgrade-<version>-<arch>.tar, .sha256 and .tar.minisig")
	f.StringVar(&o.signKey, "sign-key", "", "minisign secret key to sign the bundle with (password from $FERRY_SIGN_PASSWORD if it has one)")
	f.StringVar(&o.platforms, "platforms", create.PlatformsArch, "manifest lists: 'arch' keeps the list but copies only its linux/<arch> images; 'all' copies every platform")
	f.StringVar(&o.signatures, "signatures", create.SignaturesAll, "sigstore signatures (cosign's sha256-<hex>.sig tags) to copy: 'all' images that have any, or only the 'release' image's")
	f.StringVar(&o.workDir, "work-dir", "", "where the registry tree is built (default <output>/.ferry-work-<version>-<arch>); a rerun after an interruption reuses it")
	f.BoolVar(&o.keepWork, "keep-work-dir", false, "keep the work directory after success")
	f.IntVar(&o.jobs, "jobs", 4, "images copied at once")
	f.StringVar(&o.rateLimit, "rate-limit", "", "bytes per second fetched, all images together (e.g. 2M for a 20 Mbit/s link shared with others); a download cut midway resumes where it stopped")
	f.BoolVar(&o.quiet, "quiet", false, "no progress output")
	f.StringVar(&o.sigStore, "signature-store", signatureStoreDefault(), "where the release's signatures are fetched when no --release-signature is given (<URL>/sha256=<hex>/signature-N); \"\" for none")
	f.StringArrayVar(&o.extras, "extra-image", nil, "extra image to include, by tag or digest (repeatable; a tag is resolved and kept)")
	f.StringArrayVar(&o.sigFiles, "release-signature", nil, "a signature file of the release image, as a signature store serves it (repeatable)")
	f.StringArrayVar(&o.mirrors, "mirror", nil, "PREFIX=LOCATION: fetch images whose name starts with PREFIX from LOCATION, keep the original name (repeatable; several of one PREFIX are tried in order, the first that has an image serves all of it)")
	c.RegisterFlagCompletionFunc("arch", choices(archs...))
	c.RegisterFlagCompletionFunc("platforms", choices(create.PlatformsArch, create.PlatformsAll))
	c.RegisterFlagCompletionFunc("signatures", choices(create.SignaturesAll, create.SignaturesRelease))
	for _, d := range []string{"output", "work-dir", "cert-dir"} {
		c.MarkFlagDirname(d)
	}
	for _, n := range []string{"release", "version", "extra-image", "mirror", "jobs", "signature-store", "rate-limit"} {
		c.RegisterFlagCompletionFunc(n, cobra.NoFileCompletions)
	}
	return c
}

// signatureStoreDefault is the public store, or $FERRY_SIGNATURE_STORE when
// set (even empty: tests and sites with no route to it).
func signatureStoreDefault() string {
	if v, ok := os.LookupEnv("FERRY_SIGNATURE_STORE"); ok {
		return v
	}
	return create.DefaultSignatureStore
}

func runBundleCreate(ctx context.Context, stdout, stderr io.Writer, f *createOptions) error {
	releases, err := releaseImages(f)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	o := create.Options{
		Releases:    releases,
		Version:     f.version,
		Arch:        f.arch,
		ExtraImages: f.extras,
		Platforms:   f.platforms,
		Signatures:  f.signatures,
		Insecure:    !f.tlsVerify,
		OutputDir:   f.output,
		WorkDir:     f.workDir,
		KeepWork:    f.keepWork,
		Jobs:        f.jobs,
		Log:         log,
	}
	if o.Arch != "" && bundle.UnameArch(o.Arch) == "" {
		return usageError("--arch %q: want x86_64, aarch64, ppc64le or s390x", o.Arch)
	}
	if o.Platforms != create.PlatformsArch && o.Platforms != create.PlatformsAll {
		return usageError("--platforms %q: want arch or all", o.Platforms)
	}
	if o.Signatures != create.SignaturesAll && o.Signatures != create.SignaturesRelease {
		return usageError("--signatures %q: want all or release", o.Signatures)
	}
	if f.rateLimit != "" {
		n, err := bundle.ParseSize(f.rateLimit)
		if err != nil {
			return usageError("--rate-limit: %v", err)
		}
		o.RateLimit = n
	}
	if f.extraFile != "" {
		more, err := create.ReadImageList(f.extraFile)
		if err != nil {
			return usageError("--extra-images-file: %v", err)
		}
		o.ExtraImages = append(o.ExtraImages, more...)
	}
	for _, m := range f.mirrors {
		mm, err := create.ParseMirror(m)
		if err != nil {
			return usageError("--mirror: %v", err)
		}
		o.Mirrors = append(o.Mirrors, mm)
	}
	if o.Transport, err = create.NewTransport(f.certDir, f.tlsVerify); err != nil {
		return usageError("%v", err)
	}
	if f.pullSecret != "" {
		if o.Keychain, err = create.LoadPullSecret(f.pullSecret); err != nil {
			return usageError("%v", err)
		}
	}
	for _, f := range f.sigFiles {
		b, err := os.ReadFile(f)
		if err != nil {
			return usageError("--release-signature: %v", err)
		}
		o.ReleaseSignatures = append(o.ReleaseSignatures, b)
	}
	o.SignatureStore = f.sigStore
	if f.signKey != "" {
		key, err := bundle.LoadSignKey(f.signKey, os.Getenv("FERRY_SIGN_PASSWORD"))
		if err != nil {
			return usageError("--sign-key: %v", err)
		}
		o.SignKey = &key
	}
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		sec, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return usageError("SOURCE_DATE_EPOCH %q is not a number of seconds", s)
		}
		o.Created = time.Unix(sec, 0)
	}
	if !f.quiet {
		terminal := isTerminal(stderr)
		o.Progress = create.ProgressPrinter(stderr, terminal, log, 5*time.Second)
		if terminal {
			// Log lines would break the progress line: only warnings.
			o.Log = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
		}
	}
	res, err := create.Run(ctx, o)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, res.TarPath)
	log.Info("bundle created", "tar", res.TarPath, "digest", res.Digest, "size", bundle.HumanSize(res.TarSize),
		"images", len(res.Metadata.AllImages()), "blobsFetched", res.BlobsFetched, "blobsReused", res.BlobsReused,
		"path", hopVersions(res.Metadata.Hops()))
	return nil
}

// releaseImages are the --release images, a version standing for its
// release image for --arch; with none, that of --version and --arch.
func releaseImages(f *createOptions) ([]string, error) {
	if len(f.releases) == 0 {
		if f.version == "" || f.arch == "" {
			return nil, usageError("--release, or --version and --arch, is required")
		}
		return []string{bundle.ReleaseImage(f.version, f.arch)}, nil
	}
	if len(f.releases) > 1 && f.version != "" {
		return nil, usageError("--version names one release; with several --release each release says its own version: drop --version")
	}
	var out []string
	for _, r := range f.releases {
		if _, ok := hop.Parse(r); ok && !strings.ContainsAny(r, "/:@") {
			if f.arch == "" {
				return nil, usageError("--release %s is a version: give --arch too (its image is %s)", r, bundle.ReleaseImage(r, "<arch>"))
			}
			r = bundle.ReleaseImage(r, f.arch)
		}
		out = append(out, r)
	}
	return out, nil
}

// hopVersions is a path as the engineer reads it: 4.17.20 → 4.18.10.
func hopVersions(hops []bundle.Hop) string {
	var v []string
	for _, h := range hops {
		v = append(v, h.Version)
	}
	return strings.Join(v, " → ")
}
