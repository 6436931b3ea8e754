//go:build tools

// Package tools pins the upstream control-plane binaries built by
// scripts/build-control-plane.sh. It contains no code of ours.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
