package git

import (
	"strconv"
	"strings"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/storer"
)

// Exactly once is a property of the branch's data, not of who believes they write it. Every
// commit a worker makes says which changes it carries: one line per change in its body,
//
//	<op> <group|core>/<resource> <namespace>/<name> resourceVersion=<rv> uid=<uid>
//
// and, with the writer trailer, the folder they went to (Kubescribe-Folder) and the cluster they
// came from (Kubescribe-Cluster). Whenever a worker takes in commits it did not make (it opens
// the branch, or a fetch finds it moved), it reads what each of them carries into
// Worker.held, and a change of a version the branch holds, or of an older version of its
// object, is never committed (treeBuilder.materialize): whoever made those commits, another
// replica, an older epoch of its own slot, or a writer paused past its Lease.
//
// Only commits of the worker's own slot (its Kubescribe-Writer trailer) are read: they are
// the ones whose lines say what kubescribe wrote into the slot's folders. Anyone else's commits
// are someone else's edits (foreignEdits). With signing, a commit is the slot's only when it is
// signed with the slot's key: a pushed trailer alone makes nobody's commit kubescribe's.

// FolderTrailer is the commit trailer that names the GitTarget folder a commit wrote.
const FolderTrailer = "Kubescribe-Folder"

// clusterTrailer names the source cluster of a commit's changes (commitMessage).
const clusterTrailer = "Kubescribe-Cluster"

// folderTrailer is the trailer line naming the folder of targetPath ("/" for the root).
func folderTrailer(targetPath string) string {
	return FolderTrailer + ": /" + folderKey(targetPath) + "\n"
}

// carried is what one commit says it holds: the newest version of each object it names, in
// the folder it wrote.
type carried struct {
	folder   string
	versions map[string]heldVersion // by pushedObject
}

// carriedBy reads what commit c carries for slot: ok is false for a commit of another slot, of
// no slot (someone else's), or one that does not name its folder (made before commits carried
// it). A commit names one source cluster (a GitTarget has one), none for the unnamed one.
func carriedBy(c *object.Commit, slot string) (carried, bool) {
	body, trailers := splitTrailers(c.Message)
	if slot == "" || epochIn(trailers, slot) == 0 {
		return carried{}, false
	}
	folder, cluster := "", ""
	folders, clusters := 0, 0
	for _, t := range trailers {
		k, v, ok := strings.Cut(t, ": ")
		if !ok {
			continue
		}
		switch k {
		case FolderTrailer:
			folder, folders = strings.TrimPrefix(v, "/"), folders+1
		case clusterTrailer:
			cluster, clusters = v, clusters+1
		}
	}
	if folders != 1 || clusters > 1 {
		return carried{}, false
	}
	out := carried{folder: folder, versions: map[string]heldVersion{}}
	for _, line := range body {
		obj, v, ok := parseChangeLine(line, cluster)
		if !ok {
			continue
		}
		out.versions[obj] = out.versions[obj].newer(v)
	}
	return out, true
}

// splitTrailers splits a commit message into the lines before its last paragraph and the
// lines of that paragraph (its trailers).
func splitTrailers(message string) (body, trailers []string) {
	lines := strings.Split(strings.TrimRight(message, "\n"), "\n")
	i := len(lines)
	for i > 0 && lines[i-1] != "" {
		i--
	}
	return lines[:i], lines[i:]
}

// parseChangeLine reads one change line of commitMessage: the object (pushedObject, in cluster)
// and its version. Lines of changes without a numeric version (a sweep's deletions) and any
// other line give ok=false.
func parseChangeLine(line, cluster string) (object string, held heldVersion, ok bool) {
	f := strings.Fields(line)
	if len(f) < 4 {
		return "", heldVersion{}, false
	}
	switch f[0] {
	case "create", "update", "delete":
	default:
		return "", heldVersion{}, false
	}
	group, resource, ok := strings.Cut(f[1], "/")
	if !ok {
		return "", heldVersion{}, false
	}
	v, ok := strings.CutPrefix(f[3], "resourceVersion=")
	if !ok {
		return "", heldVersion{}, false
	}
	rv, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return "", heldVersion{}, false
	}
	if group == CoreGroupDir {
		group = ""
	}
	ns, name, namespaced := strings.Cut(f[2], "/")
	if !namespaced {
		ns, name = "", f[2]
	}
	return cluster + "\x00" + group + "/" + resource + "\x00" + ns + "/" + name, heldVersion{rv: rv, deleted: f[0] == "delete"}, true
}

// hold adds what c carries for slot to b. It reports whether c is a commit of slot: signed with
// signer, when commits are signed (signedBy); a commit that only claims the slot's trailer is
// someone else's.
func (b onBranch) hold(c *object.Commit, slot string, signer Signer) bool {
	cr, ok := carriedBy(c, slot)
	if ok && !signedBy(c, signer) {
		return false
	}
	if !ok {
		return false
	}
	for o, v := range cr.versions {
		k := [2]string{cr.folder, o}
		b[k] = b[k].newer(v)
	}
	return true
}

// takeIn reads into w.held what the commits from tip down to stop (excluded) carry, looking at
// most at limit commits, and returns the commits that are not the slot's (someone else's). complete
// reports whether it saw every commit between them: no limit was hit and no commit was missing
// from s (a shallow fetch that did not reach stop).
func (w *Worker) takeIn(s storer.EncodedObjectStorer, tip, stop plumbing.Hash, limit int) (foreign []*object.Commit, complete bool) {
	if w.held == nil {
		w.held = onBranch{}
	}
	complete = true
	ended := walkCommits(s, tip, limit, func(h plumbing.Hash) bool {
		if h == stop {
			return false
		}
		c, err := object.GetCommit(s, h)
		if err != nil {
			complete = false
			return false
		}
		if len(c.ParentHashes) == 0 && !stop.IsZero() {
			complete = false // the root, and stop was not on the way
		}
		if !w.held.hold(c, w.opts.WriterSlot, w.currentSigner()) {
			foreign = append(foreign, c)
		}
		return true
	})
	return foreign, complete && ended
}
