package git

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"strconv"
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
	// request is the close request that closed the window, if any (applyRequest).
	request *CloseRequest

	// sha is the materialized commit, zero while the plan has no commit yet.
	sha plumbing.Hash
	// objects are the objects the materialization wrote (blobs, trees, the commit): what a push
	// of this commit sends, whatever the size of the repository.
	objects []packObject
	// counted is set once the plan was counted in kubescribe_git_commits_total.
	counted bool
	// covered is what the last materialization covered: the changes, with each sweep
	// followed by the deletions it implied on that parent (expandSweeps).
	covered []attribution.AttributedChange
	// folderTree is the target folder's tree in the materialized commit.
	folderTree plumbing.Hash
	// restored counts the Unchanged changes the materialized commit writes: files the branch
	// lost (another writer removed or edited them) that are written again.
	restored int
	// duplicates counts the changes the materialization left out because the branch holds
	// their version, or a newer one, from another writer's commits (treeBuilder.held).
	duplicates      int
	duplicatesNoted bool
}

func (p *plan) info() CommitInfo {
	ci := CommitInfo{SHA: p.sha.String(), Target: p.target, Changes: p.covered, Path: folderKey(p.targetPath)}
	if !p.folderTree.IsZero() {
		ci.FolderTree = p.folderTree.String()
	}
	if p.request != nil {
		ci.Request = p.request.ID
	}
	return ci
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
		fmt.Fprintf(&b, "%s %s/%s %s resourceVersion=%s", c.Op, groupDir(c.GVR.Group), c.GVR.Resource, objectName(c.Change), oneLine(c.ResourceVersion))
		if c.UID != "" {
			fmt.Fprintf(&b, " uid=%s", oneLine(c.UID))
		}
		b.WriteString("\n")
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
			for _, src := range distinct(changes, func(c attribution.AttributedChange) string { return c.Author.Source }) {
				fmt.Fprintf(&b, "Kubescribe-Attribution-Source: %s\n", oneLine(src))
			}
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

// validChange reports why a change cannot be written, or nil. The raw parts of its path are
// checked before anything joins them, and the joined path must stay inside the target's
// folder: a namespace, group or name of ".." would otherwise climb out of it.
func validChange(targetPath string, c watch.Change) error {
	if err := checkTargetPath(targetPath); err != nil {
		return err
	}
	switch c.Op {
	case watch.OpCreate, watch.OpUpdate:
		if c.Manifest == nil {
			return fmt.Errorf("%s without manifest", c.Op)
		}
	case watch.OpDelete:
	case watch.OpSweep:
		// A sweep names no object: its scope is the namespace whose files it removes.
		s := c
		s.Namespace = c.Scope
		return checkParts(s, false)
	default:
		return fmt.Errorf("unknown op %q", c.Op)
	}
	if err := checkParts(c, true); err != nil {
		return err
	}
	if p := ObjectPath(targetPath, c); !underFolder(targetPath, p) {
		return fmt.Errorf("path %q is outside the target folder %q", p, targetPath)
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
	// trees, when set, keeps the parsed entries of the trees the last commit wrote: the next
	// commit, built on it, edits them without parsing them again.
	trees *treeCache
	// looked, when set, keeps the trees read by lookups (fileAt, subtree) during one
	// materialization, so many changes under one directory parse it once.
	looked map[plumbing.Hash]*parsedTree
	// writer is the trailer every commit carries (writer.go); "" for none.
	writer string
	// sign, when set, signs every commit (sign.go).
	sign Signer
	// held is what the branch holds from commits other writers made (carried.go): a change of
	// a version it holds, or of an older one, writes nothing.
	held onBranch
}

// lookup is tree for reading only, memoised for the materialization.
func (tb treeBuilder) lookup(h plumbing.Hash) (*parsedTree, error) {
	if t, ok := tb.looked[h]; ok {
		return t, nil
	}
	t, err := tb.tree(h)
	if err == nil && tb.looked != nil {
		tb.looked[h] = t
	}
	return t, err
}

// treeCache holds the parsed entries of the trees of the newest commit built.
type treeCache struct {
	last, next map[plumbing.Hash]*parsedTree
}

func newTreeCache() *treeCache { return &treeCache{last: map[plumbing.Hash]*parsedTree{}} }

func (c *treeCache) get(h plumbing.Hash) (*parsedTree, bool) {
	if c == nil {
		return nil, false
	}
	t, ok := c.last[h]
	return t, ok
}

func (c *treeCache) put(h plumbing.Hash, t *parsedTree) {
	if c != nil && c.next != nil {
		c.next[h] = t
	}
}

// begin starts a commit; commit makes its trees the cached ones.
func (c *treeCache) begin() {
	if c != nil {
		c.next = map[plumbing.Hash]*parsedTree{}
	}
}

func (c *treeCache) commit() {
	if c != nil && c.next != nil {
		c.last, c.next = c.next, nil
	}
}

// packObject is an object a commit created, and the object it replaced at the same path (zero
// for none): the remote holds that one, so a push may send the new one as a delta against it.
type packObject struct {
	hash plumbing.Hash
	base plumbing.Hash
	// patched, for a tree patch wrote, holds the offsets of the entry hashes it replaced in
	// base's content; everything else is base's content byte for byte, so the delta is known
	// without comparing the two.
	patched []int
}

func (tb treeBuilder) record(h, base plumbing.Hash) {
	tb.recordPatched(h, base, nil)
}

func (tb treeBuilder) recordPatched(h, base plumbing.Hash, patched []int) {
	if tb.created != nil {
		*tb.created = append(*tb.created, packObject{hash: h, base: base, patched: patched})
	}
}

func (tb treeBuilder) writeBlob(content []byte) (plumbing.Hash, error) {
	h, err := tb.s.SetEncodedObject(newRawObject(plumbing.BlobObject, content))
	if err == nil {
		tb.record(h, plumbing.ZeroHash)
	}
	return h, err
}

// rawEntry is one entry of a tree being built.
type rawEntry struct {
	name []byte
	mode filemode.FileMode
	hash plumbing.Hash
}

func (e rawEntry) isDir() bool { return e.mode == filemode.Dir }

// parsedTree is a tree's content and where its entries are in it. Trees that differ only in
// the hashes of their entries share ents (never written once built).
type parsedTree struct {
	content objectContent
	ents    []treeEntryRef
	// order tells whether ents are in Git order, which find's binary search needs: known on the
	// first lookup, and shared by trees patched from this one.
	order *treeOrder
	// marks are the SHA-1 states of a large tree's hashing (hashTree), for the trees patched
	// from it; nil for trees read from the store.
	marks []byte
}

type treeOrder int8

const (
	orderUnknown treeOrder = iota
	orderSorted
	orderUnsorted // a foreign writer's malformed tree: searched entry by entry
)

// treeEntryRef is an entry of a parsedTree: its name (pointing into the raw content of this or
// an identically laid out tree), its mode and the offset of its hash in raw.
type treeEntryRef struct {
	name []byte
	mode filemode.FileMode
	off  int
}

func (e treeEntryRef) raw() rawEntry { return rawEntry{name: e.name, mode: e.mode} }

func (t *parsedTree) hashAt(i int) plumbing.Hash {
	var h plumbing.Hash
	t.content.readAt(h[:], t.ents[i].off)
	return h
}

// find returns the index of the entry named name, -1 for none. Git keeps a tree's entries in
// order, so it is a binary search: for the name as a file's and as a directory's, which sort
// differently.
func (t *parsedTree) find(name string) int {
	if t.order == nil {
		t.order = new(treeOrder)
	}
	if *t.order == orderUnknown {
		*t.order = orderSorted
		for i := 1; i < len(t.ents); i++ {
			if compareEntries(t.ents[i-1].raw(), t.ents[i].raw()) >= 0 {
				*t.order = orderUnsorted
				break
			}
		}
	}
	if *t.order == orderUnsorted {
		for i := range t.ents {
			if string(t.ents[i].name) == name {
				return i
			}
		}
		return -1
	}
	key := []byte(name)
	for _, mode := range []filemode.FileMode{filemode.Regular, filemode.Dir} {
		want := rawEntry{name: key, mode: mode}
		i, found := slices.BinarySearchFunc(t.ents, want, func(e treeEntryRef, want rawEntry) int {
			return compareEntries(e.raw(), want)
		})
		if found && string(t.ents[i].name) == name {
			return i
		}
	}
	return -1
}

// parseTree lays out raw tree content.
func parseTree(tree plumbing.Hash, raw []byte) (*parsedTree, error) {
	t := &parsedTree{content: flatContent(raw), ents: make([]treeEntryRef, 0, bytes.Count(raw, []byte{0}))}
	pos := 0
	for pos < len(raw) {
		rest := raw[pos:]
		sp := bytes.IndexByte(rest, ' ')
		nul := bytes.IndexByte(rest, 0)
		if sp < 0 || nul < sp || len(rest) < nul+1+hashSize {
			return nil, fmt.Errorf("tree %s is malformed", tree)
		}
		mode, err := strconv.ParseUint(string(rest[:sp]), 8, 32)
		if err != nil {
			return nil, fmt.Errorf("tree %s has a malformed mode", tree)
		}
		t.ents = append(t.ents, treeEntryRef{name: rest[sp+1 : nul : nul], mode: filemode.FileMode(mode), off: pos + nul + 1})
		pos += nul + 1 + hashSize
	}
	return t, nil
}

// tree returns tree parsed, from the cache of the newest commit's trees when it is there.
func (tb treeBuilder) tree(tree plumbing.Hash) (*parsedTree, error) {
	if t, ok := tb.trees.get(tree); ok {
		return t, nil
	}
	obj, err := tb.s.EncodedObject(plumbing.TreeObject, tree)
	if err != nil {
		return nil, fmt.Errorf("read tree %s: %w", tree, err)
	}
	raw, err := readObject(obj)
	if err != nil {
		return nil, err
	}
	return parseTree(tree, raw)
}

const hashSize = 20

// apply returns the hash of tree (zero = no tree) with the edits of n applied; zero when the
// result is empty, so that empty directories vanish.
func (tb treeBuilder) apply(tree plumbing.Hash, n *editNode) (plumbing.Hash, error) {
	var t *parsedTree
	if !tree.IsZero() {
		var err error
		if t, err = tb.lookup(tree); err != nil { // parsed once with fileAt's reads
			return plumbing.ZeroHash, err
		}
		if h, ok, err := tb.patch(tree, t, n); ok || err != nil {
			return h, err
		}
	}
	var entries []rawEntry
	if t != nil {
		entries = make([]rawEntry, len(t.ents))
		for i, e := range t.ents {
			entries[i] = rawEntry{name: e.name, mode: e.mode, hash: t.hashAt(i)}
		}
	}
	find := func(name string) int {
		for i := range entries {
			if string(entries[i].name) == name {
				return i
			}
		}
		return -1
	}
	inserted, removed := false, false
	set := func(i int, e rawEntry) {
		if i >= 0 {
			entries[i] = e
			return
		}
		entries = append(entries, e)
		inserted = true
	}
	for name, child := range n.children {
		i := find(name)
		if child.isFile() {
			if child.del {
				if i >= 0 && !entries[i].isDir() {
					entries[i].hash, removed = plumbing.ZeroHash, true
				}
				continue
			}
			set(i, rawEntry{name: []byte(name), mode: filemode.Regular, hash: child.blob})
			continue
		}
		var sub plumbing.Hash
		if i >= 0 && entries[i].isDir() {
			sub = entries[i].hash
		}
		h, err := tb.apply(sub, child)
		if err != nil {
			return plumbing.ZeroHash, err
		}
		switch {
		case !h.IsZero():
			set(i, rawEntry{name: []byte(name), mode: filemode.Dir, hash: h})
		case i >= 0 && entries[i].isDir():
			entries[i].hash, removed = plumbing.ZeroHash, true
		}
	}
	if removed {
		out := entries[:0]
		for _, e := range entries {
			if !e.hash.IsZero() {
				out = append(out, e)
			}
		}
		entries = out
	}
	if len(entries) == 0 {
		return plumbing.ZeroHash, nil
	}
	if inserted {
		slices.SortFunc(entries, compareEntries)
	}
	return tb.writeTree(entries, tree)
}

// patch applies the edits of n to t (the tree with hash tree) when they only replace the hashes
// of existing entries of the same kind (files stay regular files, directories stay non-empty
// directories), the common case: the new tree is t's content with those hashes overwritten,
// laid out like t. ok is false when the edits need the general path.
func (tb treeBuilder) patch(tree plumbing.Hash, t *parsedTree, n *editNode) (plumbing.Hash, bool, error) {
	var patches []hashPatch
	for name, child := range n.children {
		i := t.find(name)
		if i < 0 {
			return plumbing.ZeroHash, false, nil
		}
		e := t.ents[i]
		if child.isFile() {
			if child.del || e.mode != filemode.Regular {
				return plumbing.ZeroHash, false, nil
			}
			patches = append(patches, hashPatch{off: e.off, h: child.blob})
			continue
		}
		if e.mode != filemode.Dir {
			return plumbing.ZeroHash, false, nil
		}
		h, err := tb.apply(t.hashAt(i), child)
		if err != nil {
			return plumbing.ZeroHash, false, err
		}
		if h.IsZero() {
			return plumbing.ZeroHash, false, nil // the directory vanished; the general path rewrites it again
		}
		patches = append(patches, hashPatch{off: e.off, h: h})
	}
	content := t.content.patched(patches)
	offsets := make([]int, len(patches))
	for i, p := range patches {
		offsets[i] = p.off
	}
	slices.Sort(offsets)
	// Before the first replaced hash, content is t's: its hashing resumes there.
	first := content.len()
	if len(offsets) > 0 {
		first = offsets[0]
	}
	h, marks := hashTree(content, t, first)
	if _, err := tb.s.SetEncodedObject(&rawObject{h: h, t: plumbing.TreeObject, c: content}); err != nil {
		return plumbing.ZeroHash, false, err
	}
	if h != tree {
		tb.recordPatched(h, tree, offsets)
	}
	// Same layout: the entries and their name index carry over.
	tb.trees.put(h, &parsedTree{content: content, ents: t.ents, order: t.order, marks: marks})
	return h, true, nil
}

// writeTree stores a tree of entries, which are in Git order; base is the tree it replaces
// (zero for none).
func (tb treeBuilder) writeTree(entries []rawEntry, base plumbing.Hash) (plumbing.Hash, error) {
	size := 0
	for _, e := range entries {
		size += 7 + len(e.name) + 1 + hashSize
	}
	buf := make([]byte, 0, size)
	ents := make([]treeEntryRef, len(entries))
	for i, e := range entries {
		buf = appendMode(buf, e.mode)
		buf = append(buf, ' ')
		start := len(buf)
		buf = append(buf, e.name...)
		buf = append(buf, 0)
		ents[i] = treeEntryRef{name: buf[start : start+len(e.name) : start+len(e.name)], mode: e.mode, off: len(buf)}
		buf = append(buf, e.hash[:]...)
	}
	content := flatContent(buf)
	h, marks := hashTree(content, nil, 0)
	if _, err := tb.s.SetEncodedObject(&rawObject{h: h, t: plumbing.TreeObject, c: content}); err != nil {
		return plumbing.ZeroHash, err
	}
	if h != base {
		tb.record(h, base)
	}
	tb.trees.put(h, &parsedTree{content: content, ents: ents, marks: marks})
	return h, nil
}

// appendMode appends a tree entry mode as Git writes it (octal, no leading zero).
func appendMode(b []byte, m filemode.FileMode) []byte {
	switch m {
	case filemode.Regular:
		return append(b, "100644"...)
	case filemode.Dir:
		return append(b, "40000"...)
	case filemode.Executable:
		return append(b, "100755"...)
	default:
		return strconv.AppendUint(b, uint64(m), 8)
	}
}

// compareEntries orders tree entries as Git does: a directory sorts as if its name ended in
// '/'. It does not allocate, unlike building the suffixed names.
func compareEntries(a, b rawEntry) int {
	n := min(len(a.name), len(b.name))
	if c := bytes.Compare(a.name[:n], b.name[:n]); c != 0 {
		return c
	}
	return cmp.Compare(entrySortByte(a, n), entrySortByte(b, n))
}

// entrySortByte is the byte at index i of the entry's sort name, -1 past its end.
func entrySortByte(e rawEntry, i int) int {
	switch {
	case i < len(e.name):
		return int(e.name[i])
	case i == len(e.name) && e.isDir():
		return '/'
	default:
		return -1
	}
}

// rawObject is an object the worker wrote: its content and hash, computed once with SHA-1
// (the objects are ours, so go-git's collision-detecting SHA-1 is not needed for them).
type rawObject struct {
	h plumbing.Hash
	t plumbing.ObjectType
	c objectContent
}

func newRawObject(t plumbing.ObjectType, cont []byte) *rawObject {
	c := flatContent(cont)
	return &rawObject{h: hashObject(t, c), t: t, c: c}
}

func (o *rawObject) Hash() plumbing.Hash         { return o.h }
func (o *rawObject) Type() plumbing.ObjectType   { return o.t }
func (o *rawObject) SetType(plumbing.ObjectType) {}
func (o *rawObject) Size() int64                 { return int64(o.c.len()) }
func (o *rawObject) SetSize(int64)               {}
func (o *rawObject) Reader() (io.ReadCloser, error) {
	return io.NopCloser(o.c.reader()), nil
}
func (o *rawObject) Writer() (io.WriteCloser, error) {
	return nil, errors.New("git: a written object is immutable")
}

// materialize writes p as a commit on parent (zero = first commit of the branch). It returns
// ok=false, and writes no commit, when p changes nothing in the parent's tree.
// On success it records in p.objects what it wrote.
func (tb treeBuilder) materialize(p *plan, parent plumbing.Hash, committer object.Signature) (sha plumbing.Hash, ok bool, err error) {
	var created []packObject
	tb.created = &created
	tb.looked = map[plumbing.Hash]*parsedTree{}
	tb.trees.begin()
	var base plumbing.Hash
	if !parent.IsZero() {
		c, err := object.GetCommit(tb.s, parent)
		if err != nil {
			return plumbing.ZeroHash, false, fmt.Errorf("read commit %s: %w", parent, err)
		}
		base = c.TreeHash
	}
	covered, err := tb.expandSweeps(base, p.targetPath, p.changes)
	if err != nil {
		return plumbing.ZeroHash, false, err
	}
	// The last change of a path decides its content. Only what differs from the parent's tree
	// is written, and only that is named in the message.
	last := make(map[string]int, len(covered))
	p.duplicates = 0
	for i, c := range covered {
		if c.Op == watch.OpSweep { // a sweep writes nothing itself
			continue
		}
		if tb.held.holds(p.targetPath, c) {
			p.duplicates++
			continue // another writer committed it, or a newer version (carried.go)
		}
		path := ObjectPath(p.targetPath, c.Change)
		if _, written := last[path]; written && c.IfMissing {
			continue // the plan writes the object already: nothing to restore
		}
		last[path] = i
	}
	root := &editNode{children: map[string]*editNode{}}
	var effective []attribution.AttributedChange
	p.restored = 0
	for i, c := range covered {
		if c.Op == watch.OpSweep {
			continue
		}
		path := ObjectPath(p.targetPath, c.Change)
		if j, ok := last[path]; !ok || j != i {
			continue
		}
		old, exists, err := tb.fileAt(base, path)
		if err != nil {
			return plumbing.ZeroHash, false, err
		}
		leaf := &editNode{del: c.Op == watch.OpDelete}
		switch {
		case leaf.del && !exists:
			continue
		case leaf.del:
		case c.IfMissing && exists:
			continue // the folder holds a version of it; the excluded write is not mirrored
		default:
			blob := newRawObject(plumbing.BlobObject, c.Manifest)
			leaf.blob = blob.h
			if exists && old == leaf.blob {
				continue
			}
			if _, err := tb.s.SetEncodedObject(blob); err != nil {
				return plumbing.ZeroHash, false, fmt.Errorf("write blob: %w", err)
			}
			tb.record(blob.h, plumbing.ZeroHash)
			if c.Snapshot {
				// Nobody was seen doing it: say what it does to the folder.
				c.Op = watch.OpCreate
				if exists {
					c.Op = watch.OpUpdate
				}
			}
		}
		root.add(path, leaf)
		effective = append(effective, c)
		if c.Unchanged {
			p.restored++
		}
	}
	p.covered = covered
	if len(effective) == 0 {
		return plumbing.ZeroHash, false, nil
	}
	p.message = commitMessage(effective, p.changes[0].Snapshot)
	if p.request != nil {
		p.message = p.request.commitMessage(p.message)
	}
	if tb.writer != "" {
		p.message += folderTrailer(p.targetPath) + tb.writer
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
	if err := signCommit(commit, tb.sign); err != nil {
		return plumbing.ZeroHash, false, err
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
	if p.folderTree, err = tb.dirIn(tree, folderKey(p.targetPath)); err != nil {
		return plumbing.ZeroHash, false, err
	}
	tb.trees.commit()
	return sha, true, nil
}

// descend walks from tree root down the folders segs. It returns the tree they lead to (zero
// when one of them is absent) and file = -1; or, when segment file names a file, that file's
// hash.
func (tb treeBuilder) descend(root plumbing.Hash, segs []string) (h plumbing.Hash, file int, err error) {
	cur := root
	for i, seg := range segs {
		if cur.IsZero() {
			return plumbing.ZeroHash, -1, nil
		}
		t, err := tb.lookup(cur)
		if err != nil {
			return plumbing.ZeroHash, -1, err
		}
		j := t.find(seg)
		if j < 0 {
			return plumbing.ZeroHash, -1, nil
		}
		if t.ents[j].mode != filemode.Dir {
			return t.hashAt(j), i, nil
		}
		cur = t.hashAt(j)
	}
	return cur, -1, nil
}

// fileAt returns the blob at path p of tree root, and whether there is one.
func (tb treeBuilder) fileAt(root plumbing.Hash, p string) (plumbing.Hash, bool, error) {
	segs := strings.Split(p, "/")
	h, file, err := tb.descend(root, segs)
	if err != nil || file != len(segs)-1 {
		return plumbing.ZeroHash, false, err
	}
	return h, true, nil
}

// subtree returns the tree at directory path p of root (nil when there is none).
func (tb treeBuilder) subtree(root plumbing.Hash, p string) (*parsedTree, error) {
	var segs []string
	if p != "" {
		segs = strings.Split(p, "/")
	}
	h, file, err := tb.descend(root, segs)
	if err != nil || file >= 0 || h.IsZero() {
		return nil, err
	}
	return tb.lookup(h)
}

// expandSweeps follows each sweep among changes by the deletions it implies on the tree root:
// one snapshot delete per file of the sweep's resource, in the target's folder and the sweep's
// namespace scope, whose object is not among those the sweep keeps. Nothing outside the
// target's folder, nor of another resource, is ever swept. The sweep itself stays, writing
// nothing, so that it is reported with the changes its window delivers: a retarget waits for it
// (Router.TargetStatus counts it) even when it implies no deletion.
func (tb treeBuilder) expandSweeps(root plumbing.Hash, targetPath string, changes []attribution.AttributedChange) ([]attribution.AttributedChange, error) {
	out := make([]attribution.AttributedChange, 0, len(changes))
	for _, c := range changes {
		out = append(out, c)
		if c.Op != watch.OpSweep {
			continue
		}
		base := strings.TrimPrefix(path.Join("/", targetPath), "/")
		var nsDirs []string
		if c.Scope != "" {
			nsDirs = []string{c.Scope}
		} else {
			t, err := tb.subtree(root, base)
			if err != nil {
				return nil, err
			}
			if t != nil {
				for _, e := range t.ents {
					if e.mode == filemode.Dir {
						nsDirs = append(nsDirs, string(e.name))
					}
				}
			}
		}
		for _, nsDir := range nsDirs {
			dir := path.Join(base, nsDir, groupDir(c.GVR.Group), c.GVR.Resource)
			t, err := tb.subtree(root, strings.TrimPrefix(dir, "/"))
			if err != nil {
				return nil, err
			}
			if t == nil {
				continue
			}
			ns := nsDir
			if ns == ClusterScopeDir {
				ns = ""
			}
			for _, e := range t.ents {
				name, ok := strings.CutSuffix(string(e.name), ".yaml")
				if !ok || e.mode == filemode.Dir || c.Keep[ns+"/"+name] {
					continue
				}
				del := c
				del.Op, del.Namespace, del.Name, del.Keep = watch.OpDelete, ns, name, nil
				del.UID, del.ResourceVersion, del.Snapshot, del.Author = "", "", true, attribution.Author{}
				if tb.held.alive(targetPath, del, c.ResourceVersion) {
					continue // another writer of the slot committed it; this stream may not have seen it yet
				}
				out = append(out, del)
			}
		}
	}
	return out, nil
}
