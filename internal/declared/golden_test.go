package declared

import (
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden.yaml from the current output")

// TestGolden pins the exact YAML of every fixture. Regenerate with
// `go test ./internal/declared/ -run TestGolden -update` and review the diff.
func TestGolden(t *testing.T) {
	for _, f := range fixtures(t) {
		t.Run(f.name, func(t *testing.T) {
			got, err := Manifest(f.obj)
			require.NoError(t, err)
			path := filepath.Join("testdata", f.name+".golden.yaml")
			if *update {
				require.NoError(t, os.WriteFile(path, got, 0o644))
			}
			want, err := os.ReadFile(path)
			require.NoError(t, err, "missing golden file; run with -update")
			require.Equal(t, string(want), string(got))
		})
	}
}
