package main

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"gopkg.in/yaml.v3"
)

// Output formats of -o, as oc's: the text (or table) when none is given.
const (
	outText = ""
	outJSON = "json"
	outYAML = "yaml"
	outWide = "wide" // the table with more columns
)

// outputFlag is the -o flag of a command that shows something.
type outputFlag struct {
	format  string
	formats []string
}

// add adds -o/--output to c, taking formats, and refuses any other value
// before c runs (exit 2).
func (o *outputFlag) add(c *cobra.Command, formats ...string) {
	o.formats = formats
	c.Flags().StringVarP(&o.format, "output", "o", outText, "output format: "+strings.Join(formats, ", ")+" (default: text)")
	c.RegisterFlagCompletionFunc("output", choices(formats...))
	c.PreRunE = func(*cobra.Command, []string) error {
		if o.format != outText && !slices.Contains(o.formats, o.format) {
			return usageError("-o %q: want %s", o.format, strings.Join(o.formats, ", "))
		}
		return nil
	}
}

// isObject: the format prints the object itself (json, yaml), not text.
func isObject(format string) bool { return format == outJSON || format == outYAML }

// writeObject writes v as indented JSON, or as YAML made from that JSON:
// its fields are the JSON's, by the same names and in the same order.
func writeObject(w io.Writer, v any, format string) error {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return err
	}
	if format == outJSON {
		_, err := io.WriteString(w, b.String())
		return err
	}
	// JSON is YAML: decoded as a node tree it keeps the key order and the
	// numbers as written (a map[string]any would sort the keys and turn
	// large integers into floats).
	var n yaml.Node
	if err := yaml.Unmarshal([]byte(b.String()), &n); err != nil {
		return fmt.Errorf("yaml: %w", err)
	}
	blockStyle(&n)
	ye := yaml.NewEncoder(w)
	ye.SetIndent(2)
	if err := ye.Encode(&n); err != nil {
		return err
	}
	return ye.Close()
}

// blockStyle drops the JSON's flow style and quotes: the encoder quotes
// only the strings that need it.
func blockStyle(n *yaml.Node) {
	n.Style = 0
	for _, c := range n.Content {
		blockStyle(c)
	}
}

// newTable is a tab-separated table aligned as oc aligns its own; Flush
// writes it.
func newTable(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 6, 4, 3, ' ', 0) }
