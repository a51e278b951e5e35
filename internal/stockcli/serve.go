package stockcli

import (
	"fmt"
	"net/http"
	"slices"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/fenceq/fenceq/cli"
	"github.com/fenceq/fenceq/internal/httpserver"
)

func serveCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "serve",
		Usage: "serve the orders API (POST /orders, GET /orders/{id}), /metrics and /healthz until SIGINT or SIGTERM",
		Description: "POST /orders takes an Idempotency-Key header and a JSON body such as\n" +
			`  {"customer_email": "ada@example.com", "currency": "EUR", "items": [{"sku": "A1", "quantity": 2, "unit_price_cents": 1250}]}` + "\n" +
			"Retries with the same key and body get the same order back (Idempotent-Replayed: true).\n" +
			"Confirmation emails go to the outbox; run `fenceq worker` to deliver them.",
		Flags: append([]ucli.Flag{
			&ucli.StringFlag{Name: "addr", Value: "127.0.0.1:8080", Usage: "listen address"},
			&ucli.IntFlag{Name: "max-conns", Value: 10, Usage: "database connections of this process"},
			&ucli.DurationFlag{Name: "shutdown-timeout", Value: 10 * time.Second, Usage: "how long requests in flight may finish on shutdown"},
		}, slices.Concat(orderFlags(), logFlags(), []ucli.Flag{databaseURLFlag()})...),
		Action: serve,
	}
}

func serve(c *ucli.Context) error {
	if err := needArgs(c, 0, 0, "[--addr HOST:PORT]"); err != nil {
		return err
	}
	log, err := newLogger(c)
	if err != nil {
		return err
	}
	if c.Int("max-conns") < 1 {
		return usageError{Err: fmt.Errorf("invalid --max-conns %d: must be at least 1", c.Int("max-conns"))}
	}
	pool, err := openOrders(c, int32(c.Int("max-conns")))
	if err != nil {
		return err
	}
	defer pool.Close()
	m, err := newMetrics(pool, log)
	if err != nil {
		return err
	}
	svc, err := newOrderService(c, pool, log, m.Orders)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/", svc.Handler()) // the orders API, and its JSON 404 for unknown paths
	mux.Handle("GET /metrics", m.handler())
	mux.Handle("GET /healthz", cli.HealthzHandler(pool))
	srv, err := httpserver.Start(c.String("addr"), mux, log, "orders API")
	if err != nil {
		return err
	}
	select {
	case <-c.Context.Done():
		log.Info("shutting down: finishing requests in flight", "timeout", c.Duration("shutdown-timeout"))
		return srv.Stop(c.Duration("shutdown-timeout"))
	case <-srv.Done():
		return fmt.Errorf("orders API stopped: %w", srv.Err())
	}
}
