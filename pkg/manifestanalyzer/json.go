package manifestanalyzer

import (
	"encoding/json"
	"io"
)

// WriteJSON writes a Report or RepoReport as indented JSON followed by a newline, with no HTML
// escaping (so "<namespace>" stays readable). `kubescribe scan --format json` prints exactly this.
func WriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
