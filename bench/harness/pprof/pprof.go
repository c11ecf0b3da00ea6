//go:build benchpprof

// This file is not part of the gateway. `make bench-e2e` with -profile
// compiles it into cmd/gateway through go build -overlay, so the gateway
// under load serves net/http/pprof on BENCH_PPROF_ADDR (127.0.0.1 only).
package main

import (
	"net/http"
	_ "net/http/pprof" // registers on http.DefaultServeMux
	"os"
	"runtime"
)

func init() {
	addr := os.Getenv("BENCH_PPROF_ADDR")
	if addr == "" {
		return
	}
	runtime.MemProfileRate = 64 << 10 // sample every 64 KiB allocated; the default 512 KiB sees too little in a few seconds
	go func() { _ = http.ListenAndServe(addr, nil) }()
}
