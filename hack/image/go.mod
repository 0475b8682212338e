// Module image builds kubescribe's container image (make image). It is kept apart from the main
// module so that go-containerregistry and what it requires never enter kubescribe's dependency
// graph or move the versions the server is built with.
module github.com/kubescribe/kubescribe/hack/image

go 1.26.0

require github.com/google/go-containerregistry v0.22.1

require (
	github.com/klauspost/compress v1.19.2 // indirect
	github.com/opencontainers/go-digest v1.0.0 // indirect
	github.com/opencontainers/image-spec v1.1.1 // indirect
	golang.org/x/sync v0.22.0 // indirect
)
