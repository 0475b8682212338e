package declared

import (
	"testing"

	sigsyaml "sigs.k8s.io/yaml"
)

// BenchmarkManifest renders a typical live Deployment. The baseline is sigs.k8s.io/yaml.Marshal
// of the same live object (no Form, JSON round trip, YAML 1.1 output), for comparison only.
func BenchmarkManifest(b *testing.B) {
	obj := loadFixture(b, "deployment")

	b.Run("Manifest", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := Manifest(obj); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Form", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = Form(obj)
		}
	})
	b.Run("baseline-sigs.k8s.io-yaml.Marshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := sigsyaml.Marshal(obj.Object); err != nil {
				b.Fatal(err)
			}
		}
	})
}
