package demo

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenceq/fenceq/internal/httpserver"
	"github.com/fenceq/fenceq/jobs/order"
)

// startOrders serves the real orders API on 127.0.0.1:0. Its commits are slowed to
// 400–600 ms, the lag that let retries through in the incident: here the retries meet
// the first request's open transaction at the idempotency key's unique index instead.
func (r *demoRun) startOrders(ctx context.Context) (*httpserver.Server, func(), error) {
	cfg, err := pgxpool.ParseConfig(r.url)
	if err != nil {
		return nil, nil, fmt.Errorf("demo: %w", err)
	}
	cfg.MaxConns = 8
	cfg.ConnConfig.RuntimeParams["application_name"] = "fenceq demo orders"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("demo: orders pool: %w", err)
	}
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(r.cfg.Seed, 7))
	svc, err := order.NewService(order.Config{Pool: pool, Metrics: r.m.Orders, Logger: r.log,
		BeforeCommit: func(ctx context.Context) error {
			mu.Lock()
			d := 400*time.Millisecond + time.Duration(rng.Int64N(int64(200*time.Millisecond)))
			mu.Unlock()
			sleepCtx(ctx, d)
			return nil
		}})
	if err != nil {
		pool.Close()
		return nil, nil, fmt.Errorf("demo: %w", err)
	}
	srv, err := httpserver.Start("127.0.0.1:0", svc.Handler(), r.log, "orders API")
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	var once sync.Once
	return srv, func() {
		once.Do(func() {
			_ = srv.Stop(5 * time.Second)
			pool.Close()
		})
	}, nil
}

// StormCounts counts the order requests by answer.
type StormCounts struct {
	Requests int64 `json:"requests"`
	// Created: 201, a new order. Replayed: 201 with Idempotent-Replayed: the same order.
	Created  int64 `json:"created"`
	Replayed int64 `json:"replayed"`
	// InFlight: 409, the key's first request is still committing: retry.
	InFlight int64 `json:"in_flight"`
	// Failed: anything else (network errors, 5xx).
	Failed int64 `json:"failed"`
}

// storm sends, for each idempotency key, the same order from clientsPerKey clients
// that retry every retryEvery, as the mobile clients of the incident did, until each has
// had its answer and sent at least minSendsPerKey requests.
func (r *demoRun) storm(ctx context.Context, base string) StormCounts {
	var requests, created, replayed, inFlight, failed atomic.Int64
	client := &http.Client{Timeout: 10 * time.Second}
	var wg sync.WaitGroup
	for k := range r.cfg.OrderKeys {
		body, _ := json.Marshal(order.Request{
			CustomerEmail: fmt.Sprintf("buyer%d@example.com", k+1), Currency: "EUR",
			Items: []order.Item{{SKU: fmt.Sprintf("SKU-%d", k%7+1), Quantity: int64(k%3 + 1), UnitPriceCents: int64(999 + 100*k)}},
		})
		key := fmt.Sprintf("demo-order-%d", k+1)
		for cl := range clientsPerKey {
			delay := time.Duration((k*clientsPerKey+cl)*37%1000) * time.Millisecond
			wg.Go(func() {
				sleepCtx(ctx, delay)
				answered := false
				for sends := 0; ctx.Err() == nil && sends < 40 && (!answered || sends < minSendsPerKey); sends++ {
					if sends > 0 {
						sleepCtx(ctx, retryEvery)
					}
					requests.Add(1)
					status, replay, err := postOrder(ctx, client, base, key, body)
					switch {
					case err != nil:
						failed.Add(1)
						if ctx.Err() == nil {
							r.log.Warn("order request failed", "key", key, "err", err)
						}
					case status == http.StatusCreated && replay:
						replayed.Add(1)
						answered = true
					case status == http.StatusCreated:
						created.Add(1)
						answered = true
					case status == http.StatusConflict:
						inFlight.Add(1)
					default:
						failed.Add(1)
						r.log.Warn("order request answered", "key", key, "status", status)
					}
				}
			})
		}
	}
	wg.Wait()
	return StormCounts{Requests: requests.Load(), Created: created.Load(), Replayed: replayed.Load(),
		InFlight: inFlight.Load(), Failed: failed.Load()}
}

func postOrder(ctx context.Context, client *http.Client, base, key string, body []byte) (int, bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/orders", bytes.NewReader(body))
	if err != nil {
		return 0, false, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(order.HeaderIdempotencyKey, key)
	resp, err := client.Do(req)
	if err != nil {
		return 0, false, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header.Get(order.HeaderReplayed) == "true", nil
}

// readMailFile counts the file mailer's lines and their distinct Message-IDs.
func readMailFile(path string) (lines, distinct int, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, fmt.Errorf("demo: read mail file: %w", err)
	}
	defer f.Close()
	ids := map[string]bool{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		var m struct {
			MessageID string `json:"message_id"`
		}
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			return 0, 0, fmt.Errorf("demo: mail file line %d: %w", lines+1, err)
		}
		lines++
		ids[m.MessageID] = true
	}
	if err := sc.Err(); err != nil {
		return 0, 0, fmt.Errorf("demo: read mail file: %w", err)
	}
	return lines, len(ids), nil
}
