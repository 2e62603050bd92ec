//go:build tools

// Package tools records the commands this module builds besides ./coredns, so that
// `go mod tidy` keeps their dependencies in go.mod and go.sum.
package tools

import (
	_ "github.com/google/go-containerregistry/cmd/crane"
)
