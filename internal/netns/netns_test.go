package netns

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"slices"
	"testing"
	"time"
)

func requireAvailable(t *testing.T) {
	t.Helper()
	if err := Available(); err != nil {
		SkipUnlessCI(t, err)
	}
}

func rootLinks(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("ip", "-o", "link", "show").Output()
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// TestNetwork builds a two-host network and checks that the hosts reach each other
// through the bridge, that a link brought down cuts its host off (read back as DOWN,
// connections refused by the kernel) until it is up again, and that the caller's own
// namespace gained no link.
func TestNetwork(t *testing.T) {
	t.Parallel()
	requireAvailable(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	before := rootLinks(t)
	n, err := Create(ctx, "nt1", "10.123.0", []string{"db", "w1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	if after := rootLinks(t); after != before {
		t.Fatalf("the caller's namespace changed:\nbefore %s\nafter %s", before, after)
	}
	db, w1 := n.Host("db"), n.Host("w1")
	ln, err := db.Listen(db.Addr + ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	addr := ln.Addr().String()
	dial := func() error {
		c, err := w1.Dial(ctx, addr, 500*time.Millisecond)
		if err == nil {
			_ = c.Close()
		}
		return err
	}
	if err := dial(); err != nil {
		t.Fatalf("w1 cannot reach %s on db: %v", addr, err)
	}
	// The listener lives in db's namespace only: the caller's loopback does not have it.
	_, port, _ := net.SplitHostPort(addr)
	if c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", port), 500*time.Millisecond); err == nil {
		_ = c.Close()
		t.Fatalf("%s answered on the caller's loopback; the listener escaped its namespace", addr)
	}

	if err := w1.SetLink(ctx, false); err != nil {
		t.Fatal(err)
	}
	if st, err := w1.Operstate(ctx); err != nil || st != "DOWN" {
		t.Fatalf("w1 operstate %q, %v after link down; want DOWN", st, err)
	}
	if err := dial(); err == nil {
		t.Fatal("w1 reached db with its link down")
	}
	if err := w1.SetLink(ctx, true); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := dial()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("w1 does not reach db after its link came up: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}

	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	names, err := List()
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range names {
		if len(ns) >= len(n.Name) && ns[:len(n.Name)] == n.Name {
			t.Fatalf("namespace %s left after Close", ns)
		}
	}
}

// TestCleanupRemovesLeftovers leaves a namespace named for a process that no longer
// runs, as a crashed run would, and checks that Cleanup removes it and nothing of a
// live process.
func TestCleanupRemovesLeftovers(t *testing.T) {
	t.Parallel()
	requireAvailable(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// A pid that is not running: a finished child's.
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	dead := fmt.Sprintf("%s-%d-left-sw", Prefix, cmd.Process.Pid)
	if err := ipCmd(ctx, "netns", "add", dead); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = deleteNS(dead) })
	live, err := Create(ctx, "nt2", "10.123.0", []string{"w1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = live.Close() })
	removed, err := Cleanup()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(removed, dead) {
		t.Fatalf("Cleanup removed %v; want %s among them", removed, dead)
	}
	names, err := List()
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(names, dead) {
		t.Fatalf("%s still exists after Cleanup", dead)
	}
	if !slices.Contains(names, live.Switch) || !slices.Contains(names, live.Hosts[0].NS) {
		t.Fatalf("Cleanup removed a live network's namespaces: %v left", names)
	}
}
