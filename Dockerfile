# kubescribe's image, for those who build images with Docker (or BuildKit, buildah, kaniko):
#
#   docker build -t kubescribe:dev \
#     --build-arg REVISION=$(git rev-parse HEAD) --build-arg VERSION=$(git describe --tags --always --dirty) .
#
# `make image` is the tested path: it builds the equivalent image without Docker or a registry
# (hack/image), reproducibly, and its test checks what the image holds. This file is not built
# by any test. It builds the same two static binaries with the same flags (keep them in step
# with goBuildFlags in hack/image/image.go) onto distroless' static nonroot base, which carries
# what hack/image lays out itself: a CA bundle, /etc/passwd and /etc/group with nonroot (65532),
# /home/nonroot, /tmp, and no shell. The root file system may be read-only: the Deployment
# mounts an emptyDir at /tmp. docs/install.md describes the image.

ARG GO_VERSION=1.26

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG TARGETOS=linux
ARG TARGETARCH
RUN CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH GOFLAGS= \
      go build -trimpath -buildvcs=false -ldflags="-s -w -buildid=" -o /out/ ./cmd/server ./cmd/kubescribe \
 && mv /out/server /out/kubescribe-server

FROM gcr.io/distroless/static-debian12:nonroot
ARG REVISION=""
ARG VERSION=""
LABEL org.opencontainers.image.source="https://github.com/kubescribe/kubescribe" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.version="${VERSION}"
COPY --from=build /out/kubescribe-server /out/kubescribe /usr/local/bin/
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/kubescribe-server"]
