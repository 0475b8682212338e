package git

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"strings"
	"time"

	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"

	"github.com/kubescribe/kubescribe/pkg/manifestanalyzer"
)

// FolderRefusedError says that a folder of the branch may not become a GitTarget's folder, and
// why: the error codes of pkg/manifestanalyzer, the same answer `kubescribe scan` gives.
type FolderRefusedError struct {
	// Path is the GitTarget's folder ("" is the repository root).
	Path string
	// Codes are the distinct error codes found, in manifestanalyzer.Codes() order.
	Codes []manifestanalyzer.Code
	// Report is the whole answer, warnings included; nil when the folder could not be
	// scanned at all (Detail says why).
	Report *manifestanalyzer.Report
	// Detail, when set, is why the folder was refused without a scan (it is a file).
	Detail string
}

// maxRefusalMessages is how many error findings the error message quotes.
const maxRefusalMessages = 3

func (e *FolderRefusedError) Error() string {
	if e.Report == nil {
		return fmt.Sprintf("folder %q may not become a GitTarget: %s", e.Path, e.Detail)
	}
	msg := fmt.Sprintf("folder %q may not become a GitTarget: %s", e.Path, e.codeList())
	var quoted []string
	n := 0
	for _, f := range e.Report.Findings {
		if f.Severity != manifestanalyzer.SeverityError {
			continue
		}
		n++
		if len(quoted) < maxRefusalMessages {
			quoted = append(quoted, f.Message)
		}
	}
	if len(quoted) == 0 {
		return msg
	}
	msg += " (first: " + strings.Join(quoted, "; ")
	if n > len(quoted) {
		msg += fmt.Sprintf("; and %d more", n-len(quoted))
	}
	return msg + ")"
}

// codeList is the codes, comma separated.
func (e *FolderRefusedError) codeList() string {
	codes := make([]string, len(e.Codes))
	for i, c := range e.Codes {
		codes[i] = string(c)
	}
	return strings.Join(codes, ", ")
}

// CheckFolder is the writer-side gate: it scans folder targetPath of tree with
// pkg/manifestanalyzer and returns a *FolderRefusedError when the folder may not become a
// GitTarget. A nil tree (a branch without commits) and a folder that does not exist yet are
// fine. Run it before the first commit into a folder.
func CheckFolder(ctx context.Context, tree *object.Tree, targetPath string) error {
	if tree == nil {
		return nil
	}
	p := folderKey(targetPath)
	sub := tree
	if p != "" {
		e, err := tree.FindEntry(p)
		if errors.Is(err, object.ErrEntryNotFound) || errors.Is(err, object.ErrDirectoryNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading folder %q: %w", p, err)
		}
		if e.Mode != filemode.Dir {
			return fmt.Errorf("folder %q of the branch is a file, not a folder", p)
		}
		if sub, err = tree.Tree(p); err != nil {
			return fmt.Errorf("reading folder %q: %w", p, err)
		}
	}
	return checkTree(ctx, sub, p)
}

// checkTree scans the tree of folder p (cleaned) with pkg/manifestanalyzer.
func checkTree(ctx context.Context, sub *object.Tree, p string) error {
	r, err := manifestanalyzer.ScanFolder(ctx, treeFS{sub}, manifestanalyzer.Options{})
	if err != nil {
		return fmt.Errorf("scanning folder %q: %w", p, err)
	}
	if !r.Adoptable {
		return &FolderRefusedError{Path: p, Codes: r.Codes(), Report: r}
	}
	return nil
}

// folderKey is a GitTarget folder as the layout and the gate name it: cleaned, "" for the
// repository root.
func folderKey(targetPath string) string {
	return strings.TrimPrefix(path.Join("/", targetPath), "/")
}

// treeFS is a read-only fs.FS over a go-git tree, so the analyzer reads the branch straight
// from the object store (no worktree).
type treeFS struct{ root *object.Tree }

func (t treeFS) Open(name string) (fs.File, error) {
	if !fs.ValidPath(name) {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrInvalid}
	}
	if name == "." {
		return &treeDir{info: treeInfo{name: ".", mode: fs.ModeDir}, tree: t.root}, nil
	}
	e, err := t.root.FindEntry(name)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	}
	switch e.Mode {
	case filemode.Dir:
		sub, err := t.root.Tree(name)
		if err != nil {
			return nil, &fs.PathError{Op: "open", Path: name, Err: err}
		}
		return &treeDir{info: treeInfo{name: path.Base(name), mode: fs.ModeDir}, tree: sub}, nil
	case filemode.Submodule:
		return &treeDir{info: treeInfo{name: path.Base(name), mode: fs.ModeDir}}, nil
	}
	f, err := t.root.File(name)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: name, Err: err}
	}
	rc, err := f.Reader()
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: name, Err: err}
	}
	return &treeFile{info: treeInfo{name: path.Base(name), size: f.Size}, rc: rc}, nil
}

type treeInfo struct {
	name string
	size int64
	mode fs.FileMode
}

func (i treeInfo) Name() string       { return i.name }
func (i treeInfo) Size() int64        { return i.size }
func (i treeInfo) Mode() fs.FileMode  { return i.mode | 0o444 }
func (i treeInfo) ModTime() time.Time { return time.Time{} }
func (i treeInfo) IsDir() bool        { return i.mode.IsDir() }
func (i treeInfo) Sys() any           { return nil }

type treeFile struct {
	info treeInfo
	rc   io.ReadCloser
}

func (f *treeFile) Stat() (fs.FileInfo, error) { return f.info, nil }
func (f *treeFile) Read(b []byte) (int, error) { return f.rc.Read(b) }
func (f *treeFile) Close() error               { return f.rc.Close() }

type treeDir struct {
	info treeInfo
	tree *object.Tree // nil for a submodule: no entries
	read int
}

func (d *treeDir) Stat() (fs.FileInfo, error) { return d.info, nil }
func (d *treeDir) Read([]byte) (int, error) {
	return 0, &fs.PathError{Op: "read", Path: d.info.name, Err: errors.New("is a directory")}
}
func (d *treeDir) Close() error { return nil }

// ReadDir lists the folder's entries in the tree's (Git's) order.
func (d *treeDir) ReadDir(n int) ([]fs.DirEntry, error) {
	var entries []object.TreeEntry
	if d.tree != nil {
		entries = d.tree.Entries[d.read:]
	}
	if n > 0 && len(entries) == 0 {
		return nil, io.EOF
	}
	if n > 0 && len(entries) > n {
		entries = entries[:n]
	}
	out := make([]fs.DirEntry, 0, len(entries))
	for _, e := range entries {
		out = append(out, treeEntry{tree: d.tree, entry: e})
	}
	d.read += len(entries)
	return out, nil
}

// treeEntry is a DirEntry whose Info reads the blob's size only when asked.
type treeEntry struct {
	tree  *object.Tree
	entry object.TreeEntry
}

func (e treeEntry) Name() string { return e.entry.Name }
func (e treeEntry) IsDir() bool  { return e.Type().IsDir() }
func (e treeEntry) Type() fs.FileMode {
	if e.entry.Mode == filemode.Dir || e.entry.Mode == filemode.Submodule {
		return fs.ModeDir
	}
	return 0
}

func (e treeEntry) Info() (fs.FileInfo, error) {
	info := treeInfo{name: e.entry.Name, mode: e.Type()}
	if !info.IsDir() {
		f, err := e.tree.TreeEntryFile(&e.entry)
		if err != nil {
			return nil, err
		}
		info.size = f.Size
	}
	return info, nil
}
