// Package netns builds a small private network of Linux network namespaces for the
// fault-injection harness: one namespace per simulated host, each with an eth0 whose
// peer sits on a bridge in a switch namespace of its own. Nothing is added to the
// caller's own namespace (no address, route or link), so no packet of the private
// network can leave it: the harness reaches the hosts only by entering their
// namespaces (Host.Do, Host.Start) or through Unix sockets.
//
//	[db] eth0 10.123.0.1 ─┐
//	[w1] eth0 10.123.0.2 ─┼─ br0 in [sw]
//	[w2] eth0 10.123.0.3 ─┘
//
// Namespaces are named PREFIX-PID-TOKEN-HOST, where PID is the creating process:
// Cleanup removes those of processes that no longer run (a crashed earlier run) and
// never touches a live run's. It needs root and the ip command of iproute2.
package netns

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Prefix starts the name of every namespace this package creates.
const Prefix = "fenceq"

// ErrUnavailable means network namespaces cannot be made here: not root, or no ip
// command.
var ErrUnavailable = errors.New("network namespaces need root and the ip command (iproute2)")

// Available reports whether Create can work on this machine, and if not, why.
func Available() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: running as uid %d", ErrUnavailable, os.Geteuid())
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	return nil
}

// Host is one namespace of the network, with its link eth0 on the bridge.
type Host struct {
	// Name is the host's short name (db, w1, …); NS the namespace's name.
	Name string
	NS   string
	// Addr is eth0's IPv4 address (without the prefix length).
	Addr string
	// peer is the other end of eth0, on the bridge in the switch namespace.
	peer string
}

// Network is a switch namespace with a bridge and the hosts attached to it.
type Network struct {
	// Name is the part of every namespace name before the host: PREFIX-PID-TOKEN.
	Name   string
	Switch string
	Hosts  []*Host
}

// Create builds the network: a switch namespace with bridge br0 and, for each name in
// hosts, a namespace whose eth0 (address subnet.N/24, N from 1 in order) is cabled to
// the bridge, with loopback up. subnet is the first three octets, e.g. "10.123.0".
// token makes the names unique among concurrent networks of this process. On failure
// everything created is removed.
func Create(ctx context.Context, token, subnet string, hosts []string) (n *Network, err error) {
	if err := Available(); err != nil {
		return nil, err
	}
	if len(hosts) == 0 || len(hosts) > 250 {
		return nil, fmt.Errorf("netns: %d hosts: want 1 to 250", len(hosts))
	}
	if ip := net.ParseIP(subnet + ".1"); ip == nil || ip.To4() == nil {
		return nil, fmt.Errorf("netns: subnet %q: want three octets such as 10.123.0", subnet)
	}
	n = &Network{Name: fmt.Sprintf("%s-%d-%s", Prefix, os.Getpid(), token)}
	n.Switch = n.Name + "-sw"
	defer func() {
		if err != nil {
			_ = n.Close()
			n = nil
		}
	}()
	if err := ipCmd(ctx, "netns", "add", n.Switch); err != nil {
		return n, err
	}
	steps := [][]string{
		{"-n", n.Switch, "link", "add", "br0", "type", "bridge"},
		{"-n", n.Switch, "link", "set", "br0", "up"},
	}
	for _, s := range steps {
		if err := ipCmd(ctx, s...); err != nil {
			return n, err
		}
	}
	for i, name := range hosts {
		h := &Host{Name: name, NS: n.Name + "-" + name, Addr: fmt.Sprintf("%s.%d", subnet, i+1), peer: fmt.Sprintf("v%d", i+1)}
		if err := ipCmd(ctx, "netns", "add", h.NS); err != nil {
			return n, err
		}
		n.Hosts = append(n.Hosts, h)
		steps := [][]string{
			{"-n", n.Switch, "link", "add", h.peer, "type", "veth", "peer", "name", "eth0", "netns", h.NS},
			{"-n", n.Switch, "link", "set", h.peer, "master", "br0"},
			{"-n", n.Switch, "link", "set", h.peer, "up"},
			{"-n", h.NS, "addr", "add", h.Addr + "/24", "dev", "eth0"},
			{"-n", h.NS, "link", "set", "eth0", "up"},
			{"-n", h.NS, "link", "set", "lo", "up"},
		}
		for _, s := range steps {
			if err := ipCmd(ctx, s...); err != nil {
				return n, err
			}
		}
	}
	return n, nil
}

// Host returns the host of that name, nil if none.
func (n *Network) Host(name string) *Host {
	for _, h := range n.Hosts {
		if h.Name == name {
			return h
		}
	}
	return nil
}

// Close kills any process left in the network's namespaces and deletes them (their
// links go with them). Calling it twice is harmless.
func (n *Network) Close() error {
	if n == nil {
		return nil
	}
	names := []string{n.Switch}
	for _, h := range n.Hosts {
		names = append(names, h.NS)
	}
	var errs []error
	for _, ns := range names {
		if err := deleteNS(ns); err != nil {
			errs = append(errs, err)
		}
	}
	n.Hosts = nil
	return errors.Join(errs...)
}

// Cleanup removes the namespaces of networks whose creating process no longer runs (a
// run that crashed or was killed), with the processes still inside them. It returns
// the namespaces it removed.
func Cleanup() ([]string, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	names, err := List()
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, ns := range names {
		rest, ok := strings.CutPrefix(ns, Prefix+"-")
		if !ok {
			continue
		}
		pidStr, _, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidStr)
		if err != nil || pid <= 0 {
			continue
		}
		if pid == os.Getpid() || !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
			continue // its creator still runs
		}
		if err := deleteNS(ns); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, ns)
	}
	return removed, errors.Join(errs...)
}

// List returns the names of the namespaces of this package on the machine.
func List() ([]string, error) {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return nil, fmt.Errorf("netns: ip netns list: %w", err)
	}
	var names []string
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && strings.HasPrefix(f[0], Prefix+"-") {
			names = append(names, f[0])
		}
	}
	return names, nil
}

func deleteNS(ns string) error {
	if out, err := exec.Command("ip", "netns", "pids", ns).Output(); err == nil {
		for _, f := range strings.Fields(string(out)) {
			if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	out, err := exec.Command("ip", "netns", "delete", ns).CombinedOutput()
	if err != nil && !strings.Contains(string(out), "No such file") {
		return fmt.Errorf("netns: ip netns delete %s: %w: %s", ns, err, strings.TrimSpace(string(out)))
	}
	return nil
}

func ipCmd(ctx context.Context, args ...string) error {
	var buf bytes.Buffer
	cmd := exec.CommandContext(ctx, "ip", args...)
	cmd.Stdout, cmd.Stderr = &buf, &buf
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("netns: ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(buf.String()))
	}
	return nil
}

// SetLink brings the host's eth0 down (a cut cable, a dead switch port) or up again.
// Down removes the host's route to the network: its sockets can send nothing until it
// is up again; connections established before stay open on both ends (TCP
// retransmits), as across a real cut.
func (h *Host) SetLink(ctx context.Context, up bool) error {
	state := "down"
	if up {
		state = "up"
	}
	return ipCmd(ctx, "-n", h.NS, "link", "set", "eth0", state)
}

// Operstate reads eth0's operational state back from the kernel (UP, DOWN, …).
func (h *Host) Operstate(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "ip", "-n", h.NS, "-j", "link", "show", "dev", "eth0").Output()
	if err != nil {
		return "", fmt.Errorf("netns: read the link state of %s: %w", h.Name, err)
	}
	var links []struct {
		Operstate string `json:"operstate"`
	}
	if err := json.Unmarshal(out, &links); err != nil || len(links) != 1 {
		return "", fmt.Errorf("netns: link state of %s: unexpected output %q", h.Name, out)
	}
	return links[0].Operstate, nil
}

// Do runs fn on an OS thread that has entered the host's namespace: sockets fn creates
// (listeners, outgoing connections) and processes it starts belong to the host. The
// thread returns to its namespace afterwards; if it cannot, it is discarded.
func (h *Host) Do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("netns: open this thread's namespace: %w", err)
			return
		}
		defer orig.Close()
		target, err := os.Open("/run/netns/" + h.NS)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("netns: open namespace %s: %w", h.NS, err)
			return
		}
		defer target.Close()
		if err := setns(target); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("netns: enter %s: %w", h.NS, err)
			return
		}
		ferr := fn()
		if err := setns(orig); err != nil {
			// Still inside the host: leave the thread locked so that it ends with
			// this goroutine instead of serving other goroutines from the wrong
			// namespace.
			errc <- errors.Join(ferr, fmt.Errorf("netns: leave %s: %w", h.NS, err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

func setns(f *os.File) error { return unix.Setns(int(f.Fd()), unix.CLONE_NEWNET) }

// Start starts cmd inside the host's namespace (see Do).
func (h *Host) Start(cmd *exec.Cmd) error { return h.Do(cmd.Start) }

// Listen opens a TCP listener inside the host's namespace.
func (h *Host) Listen(addr string) (net.Listener, error) {
	var ln net.Listener
	err := h.Do(func() error {
		var err error
		ln, err = net.Listen("tcp", addr)
		return err
	})
	return ln, err
}

// Dial connects from inside the host's namespace: the connection leaves through the
// host's own link.
func (h *Host) Dial(ctx context.Context, addr string, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := h.Do(func() error {
		d := net.Dialer{Timeout: timeout}
		var err error
		c, err = d.DialContext(ctx, "tcp", addr)
		return err
	})
	return c, err
}
