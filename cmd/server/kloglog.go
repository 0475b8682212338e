package main

import (
	"log/slog"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
)

// client-go reports what its informers and clients meet (a list or watch that failed, a watch
// that RBAC refuses, an apiserver gone) through klog, one logger of the whole process, which
// writes plain text lines to stderr that a JSON log pipeline cannot parse. As for go-redis
// (redislog.go), main hands klog the process's logger; internal/app installs nothing
// process-wide.

// installKlogLogger makes klog, and so client-go, log through log, as records of component
// client-go. klog keeps checking verbosity (its default: errors and unconditional infos only),
// so client-go's chatter does not reach the log even at --log-level=debug.
func installKlogLogger(log *slog.Logger) {
	klog.SetLogger(logr.FromSlogHandler(log.With("component", "client-go").Handler()))
}
