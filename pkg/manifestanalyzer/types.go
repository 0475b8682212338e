package manifestanalyzer

// SchemaVersion names the shape of Report and RepoReport. It changes only when a field is removed,
// renamed or changes meaning; adding a field, a Code or a Severity does not change it.
// docs/manifestanalyzer.md states the full compatibility promise.
const SchemaVersion = "manifestanalyzer.kubescribe.dev/v1"

// Code is a finding's stable machine-readable name. Codes are never renamed or reused for another
// meaning; new ones may be added.
type Code string

// The finding codes. docs/manifestanalyzer.md describes each, with what to do about it.
const (
	// CodeUnreadableFile: a file or folder inside the scanned folder could not be read.
	CodeUnreadableFile Code = "unreadable-file"
	// CodeInvalidYAML: a manifest file is not valid YAML (or JSON).
	CodeInvalidYAML Code = "invalid-yaml"
	// CodeNotKubernetesObject: a YAML document without apiVersion, kind or metadata.name, or a
	// manifest file that holds no document at all.
	CodeNotKubernetesObject Code = "not-kubernetes-object"
	// CodeMultipleDocuments: a file holds more than one object; the writer keeps one object per
	// file and would overwrite the others.
	CodeMultipleDocuments Code = "multiple-documents"
	// CodeDuplicateObject: two documents declare the same object (API group, kind, namespace,
	// name).
	CodeDuplicateObject Code = "duplicate-object"
	// CodeTemplatedContent: content that a tool renders before it is an object: Go template
	// actions ({{ }}), a Helm chart (Chart.yaml), a kustomization.
	CodeTemplatedContent Code = "templated-content"
	// CodeOutsideLayout: a manifest file that is not at
	// <namespace|_cluster>/<group|core>/<resource>/<name>.yaml below the folder.
	CodeOutsideLayout Code = "outside-layout"
	// CodeLayoutMismatch: a file in the layout whose path does not name the object it holds
	// (another namespace, group or name).
	CodeLayoutMismatch Code = "layout-mismatch"
	// CodePlaintextSecret: a core/v1 Secret with data or stringData in the clear.
	CodePlaintextSecret Code = "plaintext-secret"
	// CodeResourceUnverified (warning): the resource folder of a file is not the resource name
	// the analyzer derives from its kind, and no resolver (Options.ResourceFor) could confirm it.
	CodeResourceUnverified Code = "resource-unverified"
	// CodeRewriteExpected (warning): the file is not the declared form in kubescribe's stable
	// YAML, so the writer's first snapshot rewrites it (one commit, no data lost).
	CodeRewriteExpected Code = "rewrite-expected"
	// CodeUnrelatedFile (warning): a file that is not a manifest (README.md, .gitkeep, …). The
	// writer never touches it.
	CodeUnrelatedFile Code = "unrelated-file"
)

// Severity says whether a finding keeps a folder from becoming a GitTarget.
type Severity string

const (
	// SeverityError: the folder may not become a GitTarget while the finding stands.
	SeverityError Severity = "error"
	// SeverityWarning: worth knowing; the folder may still become a GitTarget.
	SeverityWarning Severity = "warning"
)

// severities is the severity of each code; a code's severity never changes.
var severities = map[Code]Severity{
	CodeUnreadableFile:      SeverityError,
	CodeInvalidYAML:         SeverityError,
	CodeNotKubernetesObject: SeverityError,
	CodeMultipleDocuments:   SeverityError,
	CodeDuplicateObject:     SeverityError,
	CodeTemplatedContent:    SeverityError,
	CodeOutsideLayout:       SeverityError,
	CodeLayoutMismatch:      SeverityError,
	CodePlaintextSecret:     SeverityError,
	CodeResourceUnverified:  SeverityWarning,
	CodeRewriteExpected:     SeverityWarning,
	CodeUnrelatedFile:       SeverityWarning,
}

// Codes lists every code, in a fixed order.
func Codes() []Code {
	return []Code{
		CodeUnreadableFile, CodeInvalidYAML, CodeNotKubernetesObject, CodeMultipleDocuments,
		CodeDuplicateObject, CodeTemplatedContent, CodeOutsideLayout, CodeLayoutMismatch,
		CodePlaintextSecret, CodeResourceUnverified, CodeRewriteExpected, CodeUnrelatedFile,
	}
}

// SeverityOf is the severity of a code; an unknown code is an error.
func SeverityOf(c Code) Severity {
	if s, ok := severities[c]; ok {
		return s
	}
	return SeverityError
}

// Report answers "may this folder become a GitTarget, and if not, why".
type Report struct {
	// SchemaVersion is always the package's SchemaVersion.
	SchemaVersion string `json:"schemaVersion"`
	// Path is the scanned folder, slash-separated and relative to what was scanned: "." for the
	// folder given to ScanFolder, the folder's path inside the repository for ScanRepo.
	Path string `json:"path"`
	// Adoptable is true when no finding has severity error.
	Adoptable bool `json:"adoptable"`
	// Files is the number of files below the folder (hidden files and folders excepted).
	Files int `json:"files"`
	// Objects is the number of Kubernetes objects found in them.
	Objects int `json:"objects"`
	// Findings, sorted by file, line and code; empty (never null) when there is none.
	Findings []Finding `json:"findings"`
}

// Finding is one reason a folder may not (error) or might not cleanly (warning) become a GitTarget.
type Finding struct {
	// Code is the stable machine-readable name of the finding.
	Code Code `json:"code"`
	// Severity is the code's severity.
	Severity Severity `json:"severity"`
	// File is the file concerned, slash-separated, relative to the scanned root (the folder
	// for ScanFolder, the repository for ScanRepo); empty for a finding about the folder.
	File string `json:"file,omitempty"`
	// Line is the 1-based line in File the finding points at; 0 when it concerns the whole file.
	Line int `json:"line,omitempty"`
	// Object is the object concerned, when the document was readable as one.
	Object *ObjectRef `json:"object,omitempty"`
	// Message is for people: it names the file and line, says what is wrong and what to do. Its
	// wording may change between releases; match on Code.
	Message string `json:"message"`
}

// ObjectRef identifies an object as a manifest declares it.
type ObjectRef struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Namespace  string `json:"namespace,omitempty"`
	Name       string `json:"name"`
}

// RepoReport answers "which folders of this repository could become a GitTarget".
type RepoReport struct {
	// SchemaVersion is always the package's SchemaVersion.
	SchemaVersion string `json:"schemaVersion"`
	// Folders are the candidate folders, sorted by path: every folder that has a manifest file
	// exactly four levels below it (<namespace>/<group>/<resource>/<name>.yaml), each with its
	// own report. Empty (never null) when the repository holds no such folder.
	Folders []Report `json:"folders"`
}

// Adoptable lists the paths of the folders that may become a GitTarget.
func (r *RepoReport) Adoptable() []string {
	out := []string{}
	for _, f := range r.Folders {
		if f.Adoptable {
			out = append(out, f.Path)
		}
	}
	return out
}

// Codes lists the distinct codes of the report's error findings, in the order of the package's
// Codes(): what a refused folder's condition names.
func (r *Report) Codes() []Code {
	seen := map[Code]bool{}
	var out []Code
	for _, c := range Codes() {
		for _, f := range r.Findings {
			if f.Code == c && f.Severity == SeverityError && !seen[c] {
				seen[c] = true
				out = append(out, c)
			}
		}
	}
	return out
}
