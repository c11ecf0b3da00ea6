// Command plainmochi is the reference broker of `make bench-e2e`: a
// mochi-mqtt v2 server with default options and no hook but mochi's
// allow-all authentication (without one, mochi refuses every client).
// It is what the gateway would be without throttling, persistence, the
// admin API and the inline client.
//
//	plainmochi -addr 127.0.0.1:0
//
// It prints "listening ADDR" once the listener is bound and runs until
// SIGINT or SIGTERM.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	_ "net/http/pprof" // for -pprof
	"os"
	"os/signal"
	"runtime"
	"syscall"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "plainmochi:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("plainmochi", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:0", "MQTT TCP listen `address`")
	pprofAddr := fs.String("pprof", "", "serve net/http/pprof on `address` (for bench-e2e -profile)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *pprofAddr != "" {
		runtime.MemProfileRate = 64 << 10 // as the gateway's profiling build
		go func() { _ = http.ListenAndServe(*pprofAddr, nil) }()
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	srv := mqtt.New(&mqtt.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err := srv.AddHook(new(auth.AllowHook), nil); err != nil {
		return err
	}
	l := listeners.NewNet("tcp", ln)
	if err := srv.AddListener(l); err != nil {
		return err
	}
	if err := srv.Serve(); err != nil {
		return err
	}
	fmt.Println("listening", ln.Addr())
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt, syscall.SIGTERM)
	<-stop
	if err := srv.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		return err
	}
	return nil
}
