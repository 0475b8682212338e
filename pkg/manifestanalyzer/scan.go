package manifestanalyzer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"

	yaml "go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utiljson "k8s.io/apimachinery/pkg/util/json"

	"github.com/kubescribe/kubescribe/internal/declared"
)

// Options tune a scan. The zero value is ready to use.
type Options struct {
	// ResourceFor, when set, names the resource (plural, e.g. "deployments") of an API group and
	// kind, as the cluster's discovery does; ok false means unknown. Without it the analyzer
	// derives the plural from the kind and only warns (CodeResourceUnverified) when a folder
	// name differs from its guess.
	ResourceFor func(group, kind string) (resource string, ok bool)
}

// maxFileSize bounds what is read of one file; a bigger file is reported, not read.
const maxFileSize = 8 << 20

// ScanFolder answers whether the root of fsys may become a GitTarget's folder. Findings name
// files relative to that root. An unreadable root is an error; unreadable files below it are
// findings. A root with no file at all is adoptable.
func ScanFolder(ctx context.Context, fsys fs.FS, opts Options) (*Report, error) {
	if _, err := fs.ReadDir(fsys, "."); err != nil {
		return nil, fmt.Errorf("manifestanalyzer: reading the folder: %w", err)
	}
	files, err := walk(ctx, fsys, ".")
	if err != nil {
		return nil, err
	}
	return scan(ctx, fsys, ".", files, opts)
}

// ScanPath is ScanFolder on a directory of the local file system.
func ScanPath(ctx context.Context, dir string, opts Options) (*Report, error) {
	if err := checkDir(dir); err != nil {
		return nil, err
	}
	return ScanFolder(ctx, os.DirFS(dir), opts)
}

// ScanRepo answers which folders of the repository rooted at fsys could become a GitTarget: every
// folder that has a manifest file exactly four levels below it is a candidate, and gets its own
// Report. Findings name files relative to the repository root.
func ScanRepo(ctx context.Context, fsys fs.FS, opts Options) (*RepoReport, error) {
	if _, err := fs.ReadDir(fsys, "."); err != nil {
		return nil, fmt.Errorf("manifestanalyzer: reading the repository: %w", err)
	}
	all, err := walk(ctx, fsys, ".")
	if err != nil {
		return nil, err
	}
	charts := chartDirs(all)
	candidates := map[string]bool{}
	for _, f := range all {
		if f.err != nil || path.Ext(f.path) != ".yaml" || inDirs(charts, f.path) {
			continue
		}
		segs := strings.Split(f.path, "/")
		if len(segs) >= 4 {
			candidates[path.Join(append([]string{"."}, segs[:len(segs)-4]...)...)] = true
		}
	}
	dirs := make([]string, 0, len(candidates))
	for d := range candidates {
		dirs = append(dirs, d)
	}
	sort.Strings(dirs)
	out := &RepoReport{SchemaVersion: SchemaVersion, Folders: []Report{}}
	for _, d := range dirs {
		var sub []file
		for _, f := range all {
			if inDir(d, f.path) {
				sub = append(sub, f)
			}
		}
		r, err := scan(ctx, fsys, d, sub, opts)
		if err != nil {
			return nil, err
		}
		out.Folders = append(out.Folders, *r)
	}
	return out, nil
}

// ScanRepoPath is ScanRepo on a directory of the local file system.
func ScanRepoPath(ctx context.Context, dir string, opts Options) (*RepoReport, error) {
	if err := checkDir(dir); err != nil {
		return nil, err
	}
	return ScanRepo(ctx, os.DirFS(dir), opts)
}

func checkDir(dir string) error {
	st, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("manifestanalyzer: %w", err)
	}
	if !st.IsDir() {
		return fmt.Errorf("manifestanalyzer: %s is not a directory", dir)
	}
	return nil
}

// file is one file found below the scanned root.
type file struct {
	path string // slash-separated, relative to the fs root
	err  error  // set when the file or its folder could not be read
}

// walk lists the files below dir, skipping hidden files and folders (.git, .gitkeep, …).
func walk(ctx context.Context, fsys fs.FS, dir string) ([]file, error) {
	var files []file
	err := fs.WalkDir(fsys, dir, func(p string, d fs.DirEntry, err error) error {
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
		if p != dir && strings.HasPrefix(path.Base(p), ".") {
			if d != nil && d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		if err != nil {
			if p == dir {
				return err
			}
			files = append(files, file{path: p, err: err})
			return nil
		}
		if !d.IsDir() {
			files = append(files, file{path: p})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("manifestanalyzer: %w", err)
	}
	return files, nil
}

// scanner collects the findings of one folder.
type scanner struct {
	opts   Options
	root   string // the folder, relative to the fs root
	report *Report
	seen   map[string]location // object identity -> where it was first declared
	charts []string            // folders (relative to the fs root) holding a Chart.yaml
}

type location struct {
	file string
	line int
}

func scan(ctx context.Context, fsys fs.FS, root string, files []file, opts Options) (*Report, error) {
	s := &scanner{
		opts:   opts,
		root:   root,
		report: &Report{SchemaVersion: SchemaVersion, Path: root, Findings: []Finding{}},
		seen:   map[string]location{},
	}
	s.charts = chartDirs(files)
	for _, f := range files {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		s.report.Files++
		s.file(fsys, f)
	}
	sort.SliceStable(s.report.Findings, func(i, j int) bool {
		a, b := s.report.Findings[i], s.report.Findings[j]
		if a.File != b.File {
			return a.File < b.File
		}
		if a.Line != b.Line {
			return a.Line < b.Line
		}
		return a.Code < b.Code
	})
	s.report.Adoptable = true
	for _, f := range s.report.Findings {
		if f.Severity == SeverityError {
			s.report.Adoptable = false
		}
	}
	return s.report, nil
}

func (s *scanner) add(code Code, file string, line int, obj *ObjectRef, format string, args ...any) {
	where := file
	if line > 0 {
		where += ":" + strconv.Itoa(line)
	}
	msg := fmt.Sprintf(format, args...)
	if where != "" {
		msg = where + ": " + msg
	}
	s.report.Findings = append(s.report.Findings, Finding{
		Code: code, Severity: SeverityOf(code), File: file, Line: line, Object: obj, Message: msg,
	})
}

// rel is p relative to the scanned folder.
func (s *scanner) rel(p string) string {
	if s.root == "." {
		return p
	}
	return strings.TrimPrefix(p, s.root+"/")
}

func (s *scanner) inChart(p string) (string, bool) {
	for _, c := range s.charts {
		if inDir(c, p) {
			return c, true
		}
	}
	return "", false
}

// chartDirs are the folders that hold a Helm chart (a Chart.yaml).
func chartDirs(files []file) []string {
	var out []string
	for _, f := range files {
		if b := path.Base(f.path); f.err == nil && (b == "Chart.yaml" || b == "Chart.yml") {
			out = append(out, path.Dir(f.path))
		}
	}
	return out
}

func inDir(dir, p string) bool { return dir == "." || strings.HasPrefix(p, dir+"/") }

func inDirs(dirs []string, p string) bool {
	for _, d := range dirs {
		if inDir(d, p) {
			return true
		}
	}
	return false
}

func (s *scanner) file(fsys fs.FS, f file) {
	if f.err != nil {
		s.add(CodeUnreadableFile, f.path, 0, nil, "cannot be read: %v", f.err)
		return
	}
	base := path.Base(f.path)
	if chart, ok := s.inChart(f.path); ok {
		if base == "Chart.yaml" || base == "Chart.yml" {
			s.add(CodeTemplatedContent, f.path, 0, nil,
				"a Helm chart (folder %s): the writer writes rendered objects, one per file, and would write them beside the chart; render it (helm template) or keep the chart in a folder no GitTarget writes to", chart)
		}
		return // the rest of a chart is the chart's, reported once
	}
	switch strings.ToLower(base) {
	case "kustomization.yaml", "kustomization.yml", "kustomization":
		s.add(CodeTemplatedContent, f.path, 0, nil,
			"a kustomization: it builds objects from other files, which the writer would not keep in step; render it (kustomize build) or keep it in a folder no GitTarget writes to")
		return
	}
	switch path.Ext(base) {
	case ".yaml", ".yml", ".json":
	default:
		s.add(CodeUnrelatedFile, f.path, 0, nil, "not a manifest (.yaml, .yml or .json); the writer leaves it alone")
		return
	}
	data, err := readLimited(fsys, f.path)
	if err != nil {
		s.add(CodeUnreadableFile, f.path, 0, nil, "cannot be read: %v", err)
		return
	}
	// Template actions inside string values are content (an alerting rule, a workflow step, a
	// config file in a ConfigMap) and kubescribe writes such objects itself. A template is told
	// apart by what it breaks: YAML that does not parse, or an object's identity or keys.
	docs, err := documents(data)
	if err != nil {
		if i := bytes.Index(data, []byte("{{")); i >= 0 {
			s.add(CodeTemplatedContent, f.path, lineAt(data, i), nil,
				"template action {{ … }} where YAML cannot hold it: a template, not an object; render it first")
			return
		}
		s.add(CodeInvalidYAML, f.path, yamlErrorLine(err), nil, "not valid YAML: %s", yamlErrorText(err))
		return
	}
	for _, d := range docs {
		if line := templatedStructure(d, true); line > 0 {
			s.add(CodeTemplatedContent, f.path, line, nil,
				"template action {{ … }} in a key or in apiVersion, kind, metadata.name or metadata.namespace: a template, not an object; render it first")
			return
		}
	}
	if len(docs) == 0 {
		s.add(CodeNotKubernetesObject, f.path, 0, nil, "holds no object")
		return
	}
	var objs []*unstructured.Unstructured
	var lines []int
	for i, d := range docs {
		obj, ref, line, ok := s.object(f.path, d)
		if !ok {
			continue
		}
		objs, lines = append(objs, obj), append(lines, line)
		s.report.Objects++
		if i > 0 {
			s.add(CodeMultipleDocuments, f.path, line, ref,
				"a second object in one file (%s): the writer keeps one object per file and would overwrite this one; split the file", describe(ref))
		}
		s.secret(f.path, d, obj, ref)
	}
	if len(objs) == 0 {
		return
	}
	s.layout(f.path, objs[0], lines[0], len(docs) == 1, data)
}

func readLimited(fsys fs.FS, p string) ([]byte, error) {
	f, err := fsys.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > maxFileSize {
		return nil, fmt.Errorf("larger than %d MiB", maxFileSize>>20)
	}
	var buf bytes.Buffer
	_, err = buf.ReadFrom(f)
	return buf.Bytes(), err
}

// documents parses every YAML document of data; empty documents (comments only, a bare ---) are
// left out.
func documents(data []byte) ([]*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var out []*yaml.Node
	for {
		var n yaml.Node
		err := dec.Decode(&n)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		if len(n.Content) == 0 {
			continue
		}
		doc := n.Content[0]
		if doc.Kind == yaml.ScalarNode && doc.Tag == "!!null" {
			continue
		}
		out = append(out, doc)
	}
}

var yamlLine = regexp.MustCompile(`^yaml: (?:line (\d+): )?`)

func yamlErrorLine(err error) int {
	var te *yaml.TypeError
	if errors.As(err, &te) {
		return 0
	}
	if m := yamlLine.FindStringSubmatch(err.Error()); m != nil && m[1] != "" {
		n, _ := strconv.Atoi(m[1])
		return n
	}
	return 0
}

func yamlErrorText(err error) string { return yamlLine.ReplaceAllString(err.Error(), "") }

// object reads a document as a Kubernetes object; a document that is not one is reported.
func (s *scanner) object(file string, d *yaml.Node) (*unstructured.Unstructured, *ObjectRef, int, bool) {
	if d.Kind != yaml.MappingNode {
		s.add(CodeNotKubernetesObject, file, d.Line, nil, "a document that is not a mapping, so not a Kubernetes object")
		return nil, nil, d.Line, false
	}
	var v any
	if err := d.Decode(&v); err != nil {
		s.add(CodeInvalidYAML, file, d.Line, nil, "not valid YAML: %s", yamlErrorText(err))
		return nil, nil, d.Line, false
	}
	raw, err := jsonCompatible(v)
	if err != nil {
		s.add(CodeNotKubernetesObject, file, d.Line, nil, "not a Kubernetes object: %v", err)
		return nil, nil, d.Line, false
	}
	m := map[string]any{}
	if err := utiljson.Unmarshal(raw, &m); err != nil {
		s.add(CodeNotKubernetesObject, file, d.Line, nil, "not a Kubernetes object: %v", err)
		return nil, nil, d.Line, false
	}
	obj := &unstructured.Unstructured{Object: m}
	apiVersion, _ := m["apiVersion"].(string)
	kind, _ := m["kind"].(string)
	md, _ := m["metadata"].(map[string]any)
	name, _ := md["name"].(string)
	namespace, _ := md["namespace"].(string)
	var missing []string
	if apiVersion == "" {
		missing = append(missing, "apiVersion")
	}
	if kind == "" {
		missing = append(missing, "kind")
	}
	if name == "" {
		missing = append(missing, "metadata.name")
	}
	if len(missing) > 0 {
		s.add(CodeNotKubernetesObject, file, d.Line, nil, "not a Kubernetes object: no %s", strings.Join(missing, ", no "))
		return nil, nil, d.Line, false
	}
	ref := &ObjectRef{APIVersion: apiVersion, Kind: kind, Namespace: namespace, Name: name}
	id := groupOf(apiVersion) + "/" + kind + "/" + namespace + "/" + name
	if first, dup := s.seen[id]; dup {
		s.add(CodeDuplicateObject, file, d.Line, ref, "%s is declared twice, first in %s:%d; keep one", describe(ref), first.file, first.line)
	} else {
		s.seen[id] = location{file: file, line: d.Line}
	}
	return obj, ref, d.Line, true
}

// jsonCompatible turns a decoded YAML value into JSON, refusing what no Kubernetes object holds.
func jsonCompatible(v any) ([]byte, error) {
	var conv func(v any) (any, error)
	conv = func(v any) (any, error) {
		switch v := v.(type) {
		case map[string]any:
			out := make(map[string]any, len(v))
			for k, e := range v {
				c, err := conv(e)
				if err != nil {
					return nil, err
				}
				out[k] = c
			}
			return out, nil
		case map[any]any:
			return nil, errors.New("a map key that is not a string")
		case []any:
			out := make([]any, len(v))
			for i, e := range v {
				c, err := conv(e)
				if err != nil {
					return nil, err
				}
				out[i] = c
			}
			return out, nil
		}
		return v, nil
	}
	c, err := conv(v)
	if err != nil {
		return nil, err
	}
	return json.Marshal(c)
}

func describe(r *ObjectRef) string {
	if r.Namespace == "" {
		return r.Kind + " " + r.Name
	}
	return r.Kind + " " + r.Namespace + "/" + r.Name
}

func groupOf(apiVersion string) string {
	if i := strings.LastIndex(apiVersion, "/"); i >= 0 {
		return apiVersion[:i]
	}
	return ""
}

// secret reports a core Secret whose data is in the clear (a SOPS-encrypted one is not).
func (s *scanner) secret(file string, d *yaml.Node, obj *unstructured.Unstructured, ref *ObjectRef) {
	if ref.APIVersion != "v1" || ref.Kind != "Secret" {
		return
	}
	if _, sops := obj.Object["sops"]; sops {
		return
	}
	for _, key := range []string{"data", "stringData"} {
		if m, ok := obj.Object[key].(map[string]any); ok && len(m) > 0 {
			s.add(CodePlaintextSecret, file, keyLine(d, key), ref,
				"%s holds %s in the clear: Secret values must not be in Git unencrypted; remove the file and keep the Secret out of Git, or encrypt it (SOPS, Sealed Secrets)", describe(ref), key)
			return
		}
	}
}

func keyLine(d *yaml.Node, key string) int {
	for i := 0; i+1 < len(d.Content); i += 2 {
		if d.Content[i].Value == key {
			return d.Content[i].Line
		}
	}
	return d.Line
}

// layout checks that the file is where the writer would write its (first) object.
func (s *scanner) layout(file string, obj *unstructured.Unstructured, line int, single bool, data []byte) {
	rel := s.rel(file)
	segs := strings.Split(rel, "/")
	ref := refOf(obj)
	want := ExpectedPath(ref.Namespace, groupOf(ref.APIVersion), s.resourceGuess(ref), ref.Name)
	if len(segs) != 4 || path.Ext(rel) != ".yaml" {
		s.add(CodeOutsideLayout, file, 0, ref,
			"outside the layout <namespace|_cluster>/<group|core>/<resource>/<name>.yaml; the writer would write %s at %s and leave this file behind", describe(ref), s.join(want))
		return
	}
	ns, group := segs[0], segs[1]
	wantNS := ref.Namespace
	if wantNS == "" {
		wantNS = ClusterScopeDir
	}
	wantGroup := groupOf(ref.APIVersion)
	if wantGroup == "" {
		wantGroup = CoreGroupDir
	}
	var wrong []string
	switch {
	case ns != wantNS && ref.Namespace == "":
		wrong = append(wrong, fmt.Sprintf("namespace folder %q but no metadata.namespace (a namespaced object: set metadata.namespace: %s; a cluster-scoped one: move it under %s/)", ns, ns, ClusterScopeDir))
	case ns != wantNS:
		wrong = append(wrong, fmt.Sprintf("namespace folder %q, want %q", ns, wantNS))
	}
	if group != wantGroup {
		wrong = append(wrong, fmt.Sprintf("group folder %q, want %q", group, wantGroup))
	}
	if segs[3] != ref.Name+".yaml" {
		wrong = append(wrong, fmt.Sprintf("file name %q, want %q", segs[3], ref.Name+".yaml"))
	}
	resource := segs[2]
	if s.opts.ResourceFor != nil {
		if r, ok := s.opts.ResourceFor(groupOf(ref.APIVersion), ref.Kind); ok && r != resource {
			wrong = append(wrong, fmt.Sprintf("resource folder %q, want %q", resource, r))
		} else if !ok && resource != s.resourceGuess(ref) {
			s.add(CodeResourceUnverified, file, 0, ref, "resource folder %q for kind %s: the cluster does not serve that kind, so the folder could not be checked", resource, ref.Kind)
		}
	} else if g := s.resourceGuess(ref); resource != g {
		s.add(CodeResourceUnverified, file, 0, ref, "resource folder %q for kind %s, where %q was expected; check that it is the resource's plural name as the cluster serves it", resource, ref.Kind, g)
	}
	if len(wrong) > 0 {
		s.add(CodeLayoutMismatch, file, line, ref, "the path does not name %s: %s; the writer would not keep this file as it is", describe(ref), strings.Join(wrong, ", "))
		return
	}
	if !single {
		return
	}
	if _, sops := obj.Object["sops"]; sops && ref.APIVersion == "v1" && ref.Kind == "Secret" {
		// Encrypted (SOPS), as a GitTarget with age recipients writes a Secret: its form
		// cannot be compared without the key. The writer keeps it while the Secret's version
		// is the one it pushed; a folder it adopts has its Secrets sealed again once.
		return
	}
	form := declared.Form(obj)
	out, err := declared.Encode(form)
	if err != nil || bytes.Equal(out, data) {
		return
	}
	if !reflect.DeepEqual(form.Object, obj.Object) {
		s.add(CodeRewriteExpected, file, 0, ref, "holds fields the declared form leaves out (status, server-assigned metadata or tool stamps): the writer's first snapshot rewrites it")
		return
	}
	s.add(CodeRewriteExpected, file, 0, ref, "not in kubescribe's stable YAML (key order, quoting or indentation): the writer's first snapshot rewrites it")
}

func (s *scanner) join(p string) string {
	if s.root == "." {
		return p
	}
	return s.root + "/" + p
}

func (s *scanner) resourceGuess(ref *ObjectRef) string {
	if s.opts.ResourceFor != nil {
		if r, ok := s.opts.ResourceFor(groupOf(ref.APIVersion), ref.Kind); ok {
			return r
		}
	}
	return GuessResource(ref.Kind)
}

func refOf(obj *unstructured.Unstructured) *ObjectRef {
	return &ObjectRef{APIVersion: obj.GetAPIVersion(), Kind: obj.GetKind(), Namespace: obj.GetNamespace(), Name: obj.GetName()}
}

// lineAt is the 1-based line of byte offset i in data.
func lineAt(data []byte, i int) int { return bytes.Count(data[:i], []byte("\n")) + 1 }

// identityKeys are the fields that name an object; a template action there makes a template.
var identityKeys = map[string]bool{"apiVersion": true, "kind": true, "name": true, "namespace": true}

// templatedStructure is the line of the first template action in a mapping key, or in a value of
// the object's identity (top-level apiVersion and kind, metadata's name and namespace); 0 if none.
func templatedStructure(n *yaml.Node, top bool) int {
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if strings.Contains(k.Value, "{{") {
				return k.Line
			}
			if top && k.Value == "metadata" {
				if line := templatedStructure(v, false); line > 0 {
					return line
				}
				for j := 0; v.Kind == yaml.MappingNode && j+1 < len(v.Content); j += 2 {
					if identityKeys[v.Content[j].Value] && strings.Contains(v.Content[j+1].Value, "{{") {
						return v.Content[j+1].Line
					}
				}
				continue
			}
			if top && identityKeys[k.Value] && k.Value != "name" && k.Value != "namespace" && strings.Contains(v.Value, "{{") {
				return v.Line
			}
			if line := templatedStructure(v, false); line > 0 {
				return line
			}
		}
	case yaml.SequenceNode:
		for _, c := range n.Content {
			if line := templatedStructure(c, false); line > 0 {
				return line
			}
		}
	}
	return 0
}
