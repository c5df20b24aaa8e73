// Package crio loads a bundle's images into CRI-O and pins them: it writes
// the registries.conf.d mirror, the certs.d CA and the crio.conf.d pin
// drop-in, reloads CRI-O, pulls every image over CRI through the mirror and
// checks that each is present and pinned.
package crio

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// ImageService is the part of CRI's image service the loader uses.
type ImageService interface {
	// Pull pulls ref (by its original name, so that it goes through the
	// mirror and matches its pin) and returns the image's reference.
	Pull(ctx context.Context, ref string) (string, error)
	// Status says whether ref is present and pinned. An absent image is
	// not an error.
	Status(ctx context.Context, ref string) (present, pinned bool, err error)
	// List returns every image.
	List(ctx context.Context) ([]Image, error)
}

// Image is one image as CRI lists it.
type Image struct {
	ID          string
	RepoTags    []string
	RepoDigests []string
	Size        uint64
	Pinned      bool
}

// ErrUnavailable means CRI-O does not answer on its socket (stopped,
// restarting, or the wrong socket path).
var ErrUnavailable = errors.New("CRI-O is not answering")

// Client is a CRI image client over CRI-O's unix socket.
type Client struct {
	socket string
	conn   *grpc.ClientConn
	is     runtimeapi.ImageServiceClient
	rs     runtimeapi.RuntimeServiceClient
}

var _ ImageService = (*Client)(nil)

// Dial makes a client for the CRI socket at path. It does not connect
// yet: a CRI-O that is down now is reported by the first call, as
// ErrUnavailable, and reached again once it is back.
func Dial(socket string) (*Client, error) {
	conn, err := grpc.NewClient("unix://"+socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)),
		// Reconnect quickly when CRI-O restarts (grpc's default backs
		// off up to two minutes).
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: 2 * time.Second,
		}))
	if err != nil {
		return nil, fmt.Errorf("CRI socket %s: %w", socket, err)
	}
	return &Client{socket: socket, conn: conn, is: runtimeapi.NewImageServiceClient(conn), rs: runtimeapi.NewRuntimeServiceClient(conn)}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Version returns "<runtime name> <version>", e.g. "cri-o 1.34.0".
func (c *Client) Version(ctx context.Context) (string, error) {
	v, err := c.rs.Version(ctx, &runtimeapi.VersionRequest{})
	if err != nil {
		return "", c.wrap("version", "", err)
	}
	return v.GetRuntimeName() + " " + v.GetRuntimeVersion(), nil
}

// Pull implements ImageService.
func (c *Client) Pull(ctx context.Context, ref string) (string, error) {
	resp, err := c.is.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: ref}})
	if err != nil {
		return "", c.wrap("pull", ref, err)
	}
	return resp.GetImageRef(), nil
}

// Status implements ImageService.
func (c *Client) Status(ctx context.Context, ref string) (present, pinned bool, err error) {
	resp, err := c.is.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: ref}})
	if err != nil {
		return false, false, c.wrap("image status", ref, err)
	}
	img := resp.GetImage()
	if img == nil {
		return false, false, nil
	}
	return true, img.GetPinned(), nil
}

// List implements ImageService.
func (c *Client) List(ctx context.Context) ([]Image, error) {
	resp, err := c.is.ListImages(ctx, &runtimeapi.ListImagesRequest{})
	if err != nil {
		return nil, c.wrap("list images", "", err)
	}
	out := make([]Image, 0, len(resp.GetImages()))
	for _, i := range resp.GetImages() {
		out = append(out, Image{ID: i.GetId(), RepoTags: i.GetRepoTags(), RepoDigests: i.GetRepoDigests(), Size: i.GetSize(), Pinned: i.GetPinned()})
	}
	return out, nil
}

// Remove removes an image (absent is not an error).
func (c *Client) Remove(ctx context.Context, ref string) error {
	_, err := c.is.RemoveImage(ctx, &runtimeapi.RemoveImageRequest{Image: &runtimeapi.ImageSpec{Image: ref}})
	if err != nil {
		return c.wrap("remove image", ref, err)
	}
	return nil
}

func (c *Client) wrap(op, ref string, err error) error {
	what := op
	if ref != "" {
		what = op + " " + ref
	}
	if status.Code(err) == codes.Unavailable {
		return fmt.Errorf("%s: %w on %s (is crio running? systemctl status crio): %v", what, ErrUnavailable, c.socket, status.Convert(err).Message())
	}
	if s, ok := status.FromError(err); ok {
		return &CRIError{Op: what, Code: s.Code(), Msg: s.Message(), Kind: pullFailure(s.Message())}
	}
	return fmt.Errorf("%s: %w", what, err)
}

// CRIError is an error CRI-O answered with.
type CRIError struct {
	Op   string
	Code codes.Code
	Msg  string
	// Kind is why a pull failed, when retrying cannot fix it:
	// ErrImageMissing, ErrImageDenied, ErrImageDamaged, ErrImageRejected;
	// nil otherwise. errors.Is sees it.
	Kind error
}

func (e *CRIError) Error() string { return fmt.Sprintf("%s: CRI-O: %s", e.Op, e.Msg) }

// Is reports whether target is e's Kind.
func (e *CRIError) Is(target error) bool { return e.Kind != nil && target == e.Kind }

// Why a pull failed, where pulling again pulls the same. CRI-O answers
// every pull failure with codes.Unknown and containers/image's words;
// the Client reads them once (pullFailure), and the Runtime decides from
// these with errors.Is.
var (
	// ErrImageMissing: the registry lacks a manifest, blob or repository
	// the reference names.
	ErrImageMissing = errors.New("the registry lacks the image")
	// ErrImageDenied: the registry refuses access to the image.
	ErrImageDenied = errors.New("the registry refuses the image")
	// ErrImageDamaged: the registry served bytes that do not match their
	// digest.
	ErrImageDamaged = errors.New("the image does not match its digest")
	// ErrImageRejected: the node's signature policy (policy.json) rejects
	// the image ("Source image rejected").
	ErrImageRejected = errors.New("the node's signature policy rejects the image")
)

// pullFailures map containers/image's words, as CRI-O passes them on, to
// the kinds of failure above.
var pullFailures = []struct {
	words []string
	kind  error
}{
	{[]string{"source image rejected"}, ErrImageRejected},
	{[]string{"manifest unknown", "blob unknown", "name unknown"}, ErrImageMissing},
	{[]string{"digest did not match", "does not match", "digest mismatch", "invalid checksum"}, ErrImageDamaged},
	{[]string{"unauthorized", "denied"}, ErrImageDenied},
}

// pullFailure is the kind of failure CRI-O's message msg says, or nil.
func pullFailure(msg string) error {
	msg = strings.ToLower(msg)
	for _, f := range pullFailures {
		for _, w := range f.words {
			if strings.Contains(msg, w) {
				return f.kind
			}
		}
	}
	return nil
}

// GRPCStatus lets status.Code see the code through wrapping.
func (e *CRIError) GRPCStatus() *status.Status { return status.New(e.Code, e.Msg) }
