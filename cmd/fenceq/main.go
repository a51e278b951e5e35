// Command fenceq administers fenceq, runs its worker for the built-in jobs and its demo:
// package cli's command tree with the built-in jobs (internal/stockcli). See `fenceq --help`.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
	// Periodic schedules name IANA zones: with the zone database in the binary, every
	// worker built from it computes the same slots, whatever its machine has installed.
	_ "time/tzdata"

	"github.com/fenceq/fenceq/internal/stockcli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		// After the first signal starts a graceful shutdown, a second one kills at once.
		<-ctx.Done()
		stop()
	}()
	code := stockcli.Run(ctx, os.Args, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
