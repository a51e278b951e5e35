package cli

import (
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/fenceq/fenceq/fenceqprom"
	"github.com/fenceq/fenceq/queue"
)

// cliMetrics are the metrics a command serves, in one registry: the worker's
// (fenceqprom), the Go runtime's, the process's, and the database collector's; a
// WorkerSetup may register more in reg.
type cliMetrics struct {
	Core *fenceqprom.Metrics
	reg  *prometheus.Registry
}

// newMetrics registers the metrics in a fresh registry; db is read at every scrape.
func newMetrics(db queue.DBTX, log *slog.Logger) (*cliMetrics, error) {
	reg := prometheus.NewRegistry()
	if err := reg.Register(collectors.NewGoCollector()); err != nil {
		return nil, fmt.Errorf("register Go metrics: %w", err)
	}
	if err := reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return nil, fmt.Errorf("register process metrics: %w", err)
	}
	m, err := fenceqprom.New(reg)
	if err != nil {
		return nil, err
	}
	if err := reg.Register(fenceqprom.NewDBCollector(db, 5*time.Second, log)); err != nil {
		return nil, fmt.Errorf("register database metrics: %w", err)
	}
	return &cliMetrics{Core: m, reg: reg}, nil
}

// handler serves the metrics in the Prometheus exposition format.
func (m *cliMetrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}
