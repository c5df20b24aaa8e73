// Command mkbig writes a large synthetic bundle for the benchmarks and
// prints its path; an existing one of the same size is reused.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/ferry-edge/ferry/test/bigbundle"
)

func main() {
	size := flag.Int64("size-mib", 2048, "bundle size in MiB")
	blob := flag.Int64("blob-mib", 32, "size of each blob in MiB")
	out := flag.String("out", "/var/tmp/ferry-bench", "output directory")
	flag.Parse()
	p, err := bigbundle.Make(*size<<20, *blob<<20, *out)
	if err != nil {
		fmt.Fprintln(os.Stderr, "mkbig:", err)
		os.Exit(1)
	}
	fmt.Println(p)
}
