package git

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/storer"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubescribe/kubescribe/internal/attribution"
	"github.com/kubescribe/kubescribe/internal/watch"
)

// plan is one logical commit: the changes of one closed window. It is materialized into a Git
// commit on top of a parent, and materialized again on a new parent when the remote moved.
type plan struct {
	targetPath string
	target     types.NamespacedName
	changes    []attribution.AttributedChange
	author     object.Signature
	message    string

	// sha is the materialized commit, zero while the plan has no commit yet.
	sha plumbing.Hash
	// objects are the objects the materialization wrote (blobs, trees, the commit): what a push
	// of this commit sends, whatever the size of the repository.
	objects []packObject
	// counted is set once the plan was counted in kubescribe_git_commits_total.
	counted bool
}

func (p *plan) info() CommitInfo {
	return CommitInfo{SHA: p.sha.String(), Target: p.target, Changes: p.changes}
}

// newPlan builds the commit metadata of a window's changes. All changes share targetPath, target
// and author (or are all snapshot changes).
func newPlan(targetPath string, changes []attribution.AttributedChange, committer Signature, domain string, now time.Time) *plan {
	snapshot := changes[0].Snapshot
	var author object.Signature
	if snapshot {
		author = object.Signature{Name: committer.Name, Email: committer.Email}
	} else {
		author = authorSignature(changes[0].Author, domain)
	}
	author.When = now
	var newest time.Time
	for _, c := range changes {
		if c.Observed.After(newest) {
			newest = c.Observed
		}
	}
	if !newest.IsZero() {
		author.When = newest
	}
	return &plan{
		targetPath: targetPath,
		target:     changes[0].Target,
		changes:    changes,
		author:     author,
		message:    commitMessage(changes, snapshot),
	}
}

// authorSignature is the Git identity of an attributed author (without time).
func authorSignature(a attribution.Author, domain string) object.Signature {
	name := sanitizeIdent(a.Username)
	if !a.Resolved || name == "" {
		return object.Signature{Name: attribution.UnresolvedUsername, Email: "unknown@" + domain}
	}
	email := name
	if !strings.Contains(name, "@") {
		email = name + "@" + domain
	}
	return object.Signature{Name: name, Email: email}
}

// sanitizeIdent removes what a Git signature cannot hold: angle brackets, line breaks, NUL.
func sanitizeIdent(s string) string {
	s = strings.Map(func(r rune) rune {
		switch r {
		case '<', '>', '\n', '\r', 0:
			return -1
		}
		return r
	}, s)
	return strings.TrimSpace(s)
}

// oneLine keeps a value on one line of the commit message.
func oneLine(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '\n' || r == '\r' {
			return ' '
		}
		return r
	}, s)
}

// commitMessage renders subject, body (one line per change) and trailers.
func commitMessage(changes []attribution.AttributedChange, snapshot bool) string {
	var b strings.Builder
	first := changes[0]
	username := first.Author.Username
	if !first.Author.Resolved || sanitizeIdent(username) == "" {
		username = attribution.UnresolvedUsername
	}
	switch {
	case snapshot && len(changes) == 1:
		fmt.Fprintf(&b, "Snapshot of %s %s", first.GVR.Resource, objectName(first.Change))
	case snapshot:
		fmt.Fprintf(&b, "Snapshot of %d objects", len(changes))
	case len(changes) == 1:
		fmt.Fprintf(&b, "%s %s %s", first.Op, first.GVR.Resource, objectName(first.Change))
	default:
		fmt.Fprintf(&b, "%d changes by %s", len(changes), username)
	}
	b.WriteString("\n\n")
	for _, c := range changes {
		fmt.Fprintf(&b, "%s %s/%s %s resourceVersion=%s\n",
			c.Op, groupDir(c.GVR.Group), c.GVR.Resource, objectName(c.Change), c.ResourceVersion)
	}
	b.WriteString("\n")
	if snapshot {
		b.WriteString("Kubescribe-Attribution: snapshot\n")
	} else {
		fmt.Fprintf(&b, "Kubescribe-User: %s\n", oneLine(username))
		if first.Author.Resolved {
			for _, id := range distinct(changes, func(c attribution.AttributedChange) string { return c.Author.AuditID }) {
				fmt.Fprintf(&b, "Kubescribe-Audit-ID: %s\n", oneLine(id))
			}
			b.WriteString("Kubescribe-Attribution: resolved\n")
		} else {
			b.WriteString("Kubescribe-Attribution: unresolved\n")
		}
	}
	for _, cl := range distinct(changes, func(c attribution.AttributedChange) string { return c.Cluster }) {
		fmt.Fprintf(&b, "Kubescribe-Cluster: %s\n", oneLine(cl))
	}
	return b.String()
}

// objectName is "<namespace>/<name>", or "<name>" for a cluster-scoped object.
func objectName(c watch.Change) string {
	if c.Namespace == "" {
		return oneLine(c.Name)
	}
	return oneLine(c.Namespace + "/" + c.Name)
}

// distinct returns the non-empty values of key over changes, first occurrence first.
func distinct(changes []attribution.AttributedChange, key func(attribution.AttributedChange) string) []string {
	seen := map[string]bool{}
	var out []string
	for _, c := range changes {
		v := key(c)
		if v == "" || seen[v] {
			continue
		}
		seen[v] = true
		out = append(out, v)
	}
	return out
}

// validChange reports why a change cannot be written, or nil.
func validChange(targetPath string, c watch.Change) error {
	switch c.Op {
	case watch.OpCreate, watch.OpUpdate:
		if c.Manifest == nil {
			return fmt.Errorf("%s without manifest", c.Op)
		}
	case watch.OpDelete:
	default:
		return fmt.Errorf("unknown op %q", c.Op)
	}
	if c.Name == "" || c.GVR.Resource == "" {
		return errors.New("name and resource are required")
	}
	if strings.Contains(c.Name, "/") || strings.Contains(c.Namespace, "/") || strings.Contains(c.GVR.Resource, "/") {
		return errors.New("namespace, name and resource must not contain '/'")
	}
	for _, seg := range strings.Split(ObjectPath(targetPath, c), "/") {
		if seg == "" || seg == "." || seg == ".." || strings.EqualFold(seg, ".git") || strings.ContainsRune(seg, 0) {
			return fmt.Errorf("path segment %q cannot be stored in git", seg)
		}
	}
	return nil
}

// editNode is one directory (or file) of the set of paths a commit touches.
type editNode struct {
	children map[string]*editNode // nil for a file
	blob     plumbing.Hash        // file content; zero with del
	del      bool
}

func (n *editNode) isFile() bool { return n.children == nil }

// add records the edit of one file; a later edit of the same path wins.
func (n *editNode) add(p string, leaf *editNode) {
	segs := strings.Split(p, "/")
	cur := n
	for _, s := range segs[:len(segs)-1] {
		next := cur.children[s]
		if next == nil || next.isFile() {
			next = &editNode{children: map[string]*editNode{}}
			cur.children[s] = next
		}
		cur = next
	}
	cur.children[segs[len(segs)-1]] = leaf
}

// treeBuilder applies path edits to trees in an object store. It reads and writes only the trees
// on the paths to the edited files: the cost of a commit depends on the depth and width of
// those paths, not on the size of the repository.
type treeBuilder struct {
	s storer.EncodedObjectStorer
	// created, when set, collects every object written, each with the object it replaces at
	// the same path (a delta base the remote has, or zero).
	created *[]packObject
}

// packObject is an object a commit created, and the object it replaced at the same path (zero
// for none): the remote holds that one, so a push may send the new one as a delta against it.
type packObject struct {
	hash plumbing.Hash
	base plumbing.Hash
}

func (tb treeBuilder) record(h, base plumbing.Hash) {
	if tb.created != nil {
		*tb.created = append(*tb.created, packObject{hash: h, base: base})
	}
}

func (tb treeBuilder) writeBlob(content []byte) (plumbing.Hash, error) {
	obj := tb.s.NewEncodedObject()
	obj.SetType(plumbing.BlobObject)
	obj.SetSize(int64(len(content)))
	w, err := obj.Writer()
	if err != nil {
		return plumbing.ZeroHash, err
	}
	if _, err := w.Write(content); err != nil {
		_ = w.Close()
		return plumbing.ZeroHash, err
	}
	if err := w.Close(); err != nil {
		return plumbing.ZeroHash, err
	}
	h, err := tb.s.SetEncodedObject(obj)
	if err == nil {
		tb.record(h, plumbing.ZeroHash)
	}
	return h, err
}

// apply returns the hash of tree (zero = no tree) with the edits of n applied; zero when the
// result is empty, so that empty directories vanish.
func (tb treeBuilder) apply(tree plumbing.Hash, n *editNode) (plumbing.Hash, error) {
	var entries []object.TreeEntry
	if !tree.IsZero() {
		t, err := object.GetTree(tb.s, tree)
		if err != nil {
			return plumbing.ZeroHash, fmt.Errorf("read tree %s: %w", tree, err)
		}
		entries = append(entries, t.Entries...)
	}
	index := make(map[string]int, len(entries))
	for i, e := range entries {
		index[e.Name] = i
	}
	removed := map[string]bool{}
	set := func(e object.TreeEntry) {
		delete(removed, e.Name)
		if i, ok := index[e.Name]; ok {
			entries[i] = e
			return
		}
		index[e.Name] = len(entries)
		entries = append(entries, e)
	}
	for name, child := range n.children {
		i, exists := index[name]
		if child.isFile() {
			if child.del {
				if exists && entries[i].Mode != filemode.Dir {
					removed[name] = true
				}
				continue
			}
			set(object.TreeEntry{Name: name, Mode: filemode.Regular, Hash: child.blob})
			continue
		}
		var sub plumbing.Hash
		if exists && entries[i].Mode == filemode.Dir {
			sub = entries[i].Hash
		}
		h, err := tb.apply(sub, child)
		if err != nil {
			return plumbing.ZeroHash, err
		}
		switch {
		case !h.IsZero():
			set(object.TreeEntry{Name: name, Mode: filemode.Dir, Hash: h})
		case exists && entries[i].Mode == filemode.Dir:
			removed[name] = true
		}
	}
	out := entries[:0]
	for _, e := range entries {
		if !removed[e.Name] {
			out = append(out, e)
		}
	}
	if len(out) == 0 {
		return plumbing.ZeroHash, nil
	}
	return tb.writeTree(out, tree)
}

// writeTree stores a tree of entries; base is the tree it replaces (zero for none).
func (tb treeBuilder) writeTree(entries []object.TreeEntry, base plumbing.Hash) (plumbing.Hash, error) {
	slices.SortFunc(entries, compareEntries)
	t := &object.Tree{Entries: entries}
	obj := tb.s.NewEncodedObject()
	if err := t.Encode(obj); err != nil {
		return plumbing.ZeroHash, fmt.Errorf("encode tree: %w", err)
	}
	h, err := tb.s.SetEncodedObject(obj)
	if err == nil && h != base {
		tb.record(h, base)
	}
	return h, err
}

// compareEntries orders tree entries as Git does: a directory sorts as if its name ended in
// '/'. It does not allocate, unlike building the suffixed names.
func compareEntries(a, b object.TreeEntry) int {
	an, bn := a.Name, b.Name
	n := min(len(an), len(bn))
	if c := strings.Compare(an[:n], bn[:n]); c != 0 {
		return c
	}
	return cmp.Compare(entrySortByte(a, n), entrySortByte(b, n))
}

// entrySortByte is the byte at index i of the entry's sort name, -1 past its end.
func entrySortByte(e object.TreeEntry, i int) int {
	switch {
	case i < len(e.Name):
		return int(e.Name[i])
	case i == len(e.Name) && e.Mode == filemode.Dir:
		return '/'
	default:
		return -1
	}
}

// materialize writes p as a commit on parent (zero = first commit of the branch). It returns
// ok=false, and writes no commit, when p changes nothing in the parent's tree.
// On success it records in p.objects what it wrote.
func (tb treeBuilder) materialize(p *plan, parent plumbing.Hash, committer object.Signature) (sha plumbing.Hash, ok bool, err error) {
	var created []packObject
	tb.created = &created
	var base plumbing.Hash
	if !parent.IsZero() {
		c, err := object.GetCommit(tb.s, parent)
		if err != nil {
			return plumbing.ZeroHash, false, fmt.Errorf("read commit %s: %w", parent, err)
		}
		base = c.TreeHash
	}
	root := &editNode{children: map[string]*editNode{}}
	for _, c := range p.changes {
		leaf := &editNode{del: c.Op == watch.OpDelete}
		if !leaf.del {
			if leaf.blob, err = tb.writeBlob(c.Manifest); err != nil {
				return plumbing.ZeroHash, false, fmt.Errorf("write blob: %w", err)
			}
		}
		root.add(ObjectPath(p.targetPath, c.Change), leaf)
	}
	tree, err := tb.apply(base, root)
	if err != nil {
		return plumbing.ZeroHash, false, err
	}
	if tree == base {
		return plumbing.ZeroHash, false, nil
	}
	if tree.IsZero() {
		// Everything was deleted: the branch goes on with an empty tree.
		if tree, err = tb.writeTree(nil, base); err != nil {
			return plumbing.ZeroHash, false, err
		}
		if tree == base {
			return plumbing.ZeroHash, false, nil
		}
	}
	commit := &object.Commit{
		Author:    p.author,
		Committer: committer,
		Message:   p.message,
		TreeHash:  tree,
	}
	if !parent.IsZero() {
		commit.ParentHashes = []plumbing.Hash{parent}
	}
	obj := tb.s.NewEncodedObject()
	if err := commit.Encode(obj); err != nil {
		return plumbing.ZeroHash, false, fmt.Errorf("encode commit: %w", err)
	}
	sha, err = tb.s.SetEncodedObject(obj)
	if err != nil {
		return plumbing.ZeroHash, false, fmt.Errorf("store commit: %w", err)
	}
	tb.record(sha, plumbing.ZeroHash)
	p.objects = created
	return sha, true, nil
}
