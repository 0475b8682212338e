package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/kubescribe/kubescribe/pkg/manifestanalyzer"
)

// The exit codes of `kubescribe scan`.
const (
	exitAdoptable    = 0 // the folder (with --repo: at least one folder) may become a GitTarget
	exitNotAdoptable = 1 // it may not (with --repo: no folder may)
	exitScanError    = 2 // bad usage, or the folder could not be read
)

// scanCmd runs `kubescribe scan [--repo] [--format text|json|yaml] DIR` and returns its exit code.
func scanCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("scan", flag.ContinueOnError)
	fs.SetOutput(stderr)
	repo := fs.Bool("repo", false, "scan a whole repository: list the folders that could become a GitTarget")
	format := fs.String("format", "text", "output format: text, json or yaml")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitAdoptable
		}
		return exitScanError
	}
	if len(pos) != 1 {
		fmt.Fprintln(stderr, "kubescribe scan: want exactly one folder, e.g. kubescribe scan clusters/prod")
		return exitScanError
	}
	switch *format {
	case "text", "json", "yaml":
	default:
		fmt.Fprintf(stderr, "kubescribe scan: --format %q: want text, json or yaml\n", *format)
		return exitScanError
	}
	dir := pos[0]
	var report any
	adoptable := false
	if *repo {
		r, err := manifestanalyzer.ScanRepoPath(ctx, dir, manifestanalyzer.Options{})
		if err != nil {
			fmt.Fprintln(stderr, "kubescribe scan:", err)
			return exitScanError
		}
		report, adoptable = r, len(r.Adoptable()) > 0
	} else {
		r, err := manifestanalyzer.ScanPath(ctx, dir, manifestanalyzer.Options{})
		if err != nil {
			fmt.Fprintln(stderr, "kubescribe scan:", err)
			return exitScanError
		}
		report, adoptable = r, r.Adoptable
	}
	if err := writeReport(stdout, *format, dir, report); err != nil {
		fmt.Fprintln(stderr, "kubescribe scan:", err)
		return exitScanError
	}
	if adoptable {
		return exitAdoptable
	}
	return exitNotAdoptable
}

// parseInterspersed parses flags given before and after positional arguments, as
// `kubescribe scan DIR --format json` is natural to type.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

func writeReport(w io.Writer, format, dir string, report any) error {
	switch format {
	case "json":
		return manifestanalyzer.WriteJSON(w, report)
	case "yaml":
		var buf bytes.Buffer
		if err := manifestanalyzer.WriteJSON(&buf, report); err != nil {
			return err
		}
		out, err := yaml.JSONToYAML(buf.Bytes())
		if err != nil {
			return err
		}
		_, err = w.Write(out)
		return err
	}
	var b strings.Builder
	switch r := report.(type) {
	case *manifestanalyzer.Report:
		textReport(&b, dir, r)
	case *manifestanalyzer.RepoReport:
		adoptable := r.Adoptable()
		fmt.Fprintf(&b, "%s: %s, %d adoptable", dir, plural(len(r.Folders), "candidate folder"), len(adoptable))
		if len(adoptable) > 0 {
			fmt.Fprintf(&b, ": %s", strings.Join(adoptable, ", "))
		}
		b.WriteString("\n")
		for i := range r.Folders {
			b.WriteString("\n")
			textReport(&b, r.Folders[i].Path, &r.Folders[i])
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func textReport(b *strings.Builder, name string, r *manifestanalyzer.Report) {
	verdict := "adoptable"
	if !r.Adoptable {
		verdict = "NOT adoptable"
	}
	fmt.Fprintf(b, "%s: %s (%d objects in %d files", name, verdict, r.Objects, r.Files)
	var errs, warns int
	for _, f := range r.Findings {
		if f.Severity == manifestanalyzer.SeverityError {
			errs++
		} else {
			warns++
		}
	}
	fmt.Fprintf(b, ", %s, %s)\n", plural(errs, "error"), plural(warns, "warning"))
	for _, f := range r.Findings {
		fmt.Fprintf(b, "  %-7s %-21s %s\n", f.Severity, f.Code, f.Message)
	}
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
