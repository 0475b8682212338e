package audit

// Test helpers for the external test package (audit_test), which may import
// internal/attribution (itself an importer of this package).
var (
	SyntheticBatch = syntheticBatch
	CapturedBatch  = capturedBatch
	DecodePooled   = decodePooled
)
