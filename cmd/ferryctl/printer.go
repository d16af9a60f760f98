package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// printer writes a command's result: a table for people, JSON for programs.
type printer interface {
	// print writes v as JSON, or the header and rows as a table.
	print(v any, header []string, rows [][]string) error
}

type tablePrinter struct{ w io.Writer }

func (p tablePrinter) print(_ any, header []string, rows [][]string) error {
	tw := tabwriter.NewWriter(p.w, 2, 4, 2, ' ', 0)
	if len(header) > 0 {
		fmt.Fprintln(tw, strings.Join(header, "\t"))
	}
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	return tw.Flush()
}

type jsonPrinter struct{ w io.Writer }

func (p jsonPrinter) print(v any, _ []string, _ [][]string) error {
	enc := json.NewEncoder(p.w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
