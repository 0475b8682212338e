// Package manifestanalyzer answers, before anything is written, whether a folder of a Git
// repository may become a kubescribe GitTarget (ScanFolder) and which folders of a repository
// could (ScanRepo). It is the gate kubescribe's writer enforces before its first commit into a
// folder, and what `kubescribe scan` prints.
//
// A folder may become a GitTarget when every file in it is where the writer would write it
// (<namespace|_cluster>/<group|core>/<resource>/<name>.yaml), holds exactly one Kubernetes object
// that no other file declares, is not a template, and is not a Secret in plaintext. Anything else
// is a Finding with a stable Code. The result types are this package's own, carry SchemaVersion,
// and marshal to the JSON that `kubescribe scan --format json` prints; docs/manifestanalyzer.md
// states what may and may not change between releases.
package manifestanalyzer
