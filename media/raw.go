package media

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// A raw stick: the bundle's tar written onto the bare device.

// metadataName is the first entry of a bundle tar (bundle.MetadataName).
const metadataName = "metadata.json"

// startsWithBundle reports whether dev starts with a tar whose first entry
// is the regular file metadata.json.
func startsWithBundle(dev string) (bool, error) {
	f, err := os.OpenFile(dev, os.O_RDONLY, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ENXIO) || errors.Is(err, unix.ENOMEDIUM) {
			return false, fmt.Errorf("%s: %w: %w", dev, ErrNoMedium, err)
		}
		return false, fmt.Errorf("%s: %w", dev, err)
	}
	defer f.Close()
	ok, err := isBundleTar(f)
	if err != nil {
		return false, fmt.Errorf("%s: reading the first block: %w (the device may have been pulled)", dev, err)
	}
	return ok, nil
}

// isBundleTar reads at most 64 KiB of r (a PAX header may come first) and
// reports whether it is a tar whose first entry is metadata.json. Only a
// read error is an error; anything that is not such a tar is false.
func isBundleTar(r io.Reader) (bool, error) {
	er := &errReader{r: io.LimitReader(r, 64<<10)}
	hdr, err := tar.NewReader(er).Next()
	if er.err != nil {
		return false, er.err
	}
	if err != nil {
		return false, nil
	}
	return hdr.Name == metadataName && hdr.Typeflag == tar.TypeReg, nil
}

// errReader remembers a read error other than EOF, so that it can be told
// apart from a malformed tar.
type errReader struct {
	r   io.Reader
	err error
}

func (e *errReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil && err != io.EOF && e.err == nil {
		e.err = err
	}
	return n, err
}
