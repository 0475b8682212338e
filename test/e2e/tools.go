//go:build tools

package e2e

// The sops CLI the Secrets e2e builds (buildSops) comes from the module go.mod requires; this
// import keeps go mod tidy from dropping what its main package needs.
import _ "github.com/getsops/sops/v3/cmd/sops"
