package chaos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fenceq/fenceq/internal/redact"
)

// BuildBinary builds ./cmd/fenceq of the module that holds the current directory (found
// with `go env GOMOD`) into dir and returns the binary's path. Tests build it once and
// start every worker process from it.
func BuildBinary(ctx context.Context, dir string) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("build fenceq: go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("build fenceq: not inside a Go module (go env GOMOD is empty)")
	}
	bin := filepath.Join(dir, "fenceq")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/fenceq")
	cmd.Dir = filepath.Dir(gomod)
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("build fenceq in %s: %w: %s", cmd.Dir, err, strings.TrimSpace(buf.String()))
	}
	return bin, nil
}

// Process is one OS process of a worker slot. Each start gets a new process (and, from
// the caller, a new worker id); the log file collects every incarnation's output.
type Process struct {
	// Name is the slot's name, e.g. w2.
	Name    string
	logPath string

	mu       sync.Mutex
	cmd      *exec.Cmd
	done     chan struct{}
	state    *os.ProcessState
	waitErr  error
	starts   int
	paused   bool
	stopping bool
}

// NewProcess prepares a process slot whose output goes to logPath; Start runs it.
func NewProcess(name, logPath string) *Process {
	return &Process{Name: name, logPath: logPath}
}

// Start runs binary with args (and env added to the harness's environment) in a
// process group of its own, its output appended to the slot's log file. The process is
// killed if the harness dies (PDEATHSIG).
func (p *Process) Start(binary string, args, env []string) error {
	return p.StartIn(nil, binary, args, env)
}

// StartIn is Start with the process started by in (e.g. inside a network namespace)
// instead of exec.Cmd.Start; nil means exec.Cmd.Start.
func (p *Process) StartIn(in func(*exec.Cmd) error, binary string, args, env []string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && p.done != nil {
		select {
		case <-p.done:
		default:
			return fmt.Errorf("start %s: already running as pid %d", p.Name, p.cmd.Process.Pid)
		}
	}
	logf, err := os.OpenFile(p.logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("start %s: open log: %w", p.Name, err)
	}
	fmt.Fprintf(logf, "### %s start %d: %s %s\n", time.Now().Format(time.RFC3339Nano), p.starts+1,
		filepath.Base(binary), strings.Join(redactArgs(args), " "))
	cmd := exec.Command(binary, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if in == nil {
		in = (*exec.Cmd).Start
	}
	if err := in(cmd); err != nil {
		_ = logf.Close()
		return fmt.Errorf("start %s: %w", p.Name, err)
	}
	p.cmd, p.starts, p.paused, p.stopping = cmd, p.starts+1, false, false
	p.state, p.waitErr = nil, nil
	done := make(chan struct{})
	p.done = done
	go func() {
		err := cmd.Wait()
		_ = logf.Close()
		p.mu.Lock()
		p.state, p.waitErr = cmd.ProcessState, err
		p.mu.Unlock()
		close(done)
	}()
	return nil
}

func redactArgs(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		if name, value, ok := strings.Cut(a, "="); ok && strings.HasPrefix(name, "-") {
			out[i] = name + "=" + redact.URL(value)
		} else {
			out[i] = redact.URL(a)
		}
	}
	return out
}

// Pid returns the process id of the current incarnation, 0 when none ran.
func (p *Process) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Starts returns how many times the slot was started.
func (p *Process) Starts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.starts
}

// Running reports whether the current incarnation has not exited.
func (p *Process) Running() bool {
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	if done == nil {
		return false
	}
	select {
	case <-done:
		return false
	default:
		return true
	}
}

// Exited returns a channel closed when the current incarnation exits.
func (p *Process) Exited() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done == nil {
		c := make(chan struct{})
		close(c)
		return c
	}
	return p.done
}

// ExitStatus describes how the last incarnation ended ("" while it runs).
func (p *Process) ExitStatus() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state == nil {
		return ""
	}
	return p.state.String()
}

// Unexpected reports whether the process exited although nobody stopped or killed it:
// a crash the harness must report.
func (p *Process) Unexpected() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.state != nil && !p.stopping
}

func (p *Process) signal(sig syscall.Signal) error {
	pid := p.Pid()
	if pid == 0 || !p.Running() {
		return fmt.Errorf("%s is not running", p.Name)
	}
	// The whole process group: the worker and anything it started.
	if err := syscall.Kill(-pid, sig); err != nil {
		return fmt.Errorf("signal %s to %s (pid %d): %w", sig, p.Name, pid, err)
	}
	return nil
}

// ProcState returns the state letter of /proc/PID/stat (R, S, D, T, t, Z, …).
func ProcState(pid int) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", err
	}
	// pid (comm) STATE …; comm may hold spaces and parentheses: take the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return "", fmt.Errorf("unexpected /proc/%d/stat: %q", pid, s)
	}
	return s[i+2 : i+3], nil
}

// Pause stops the process with SIGSTOP and returns once the kernel reports it stopped
// (state T): the proof that the pause happened.
func (p *Process) Pause() (string, error) {
	if err := p.signal(syscall.SIGSTOP); err != nil {
		return "", err
	}
	p.mu.Lock()
	p.paused = true
	p.mu.Unlock()
	pid := p.Pid()
	deadline := time.Now().Add(2 * time.Second)
	for {
		st, err := ProcState(pid)
		if err == nil && (st == "T" || st == "t") {
			return fmt.Sprintf("SIGSTOP: /proc/%d/stat state %s", pid, st), nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("pause %s (pid %d): state is %q, not T, 2s after SIGSTOP (%v)", p.Name, pid, st, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Resume continues a paused process with SIGCONT.
func (p *Process) Resume() error {
	p.mu.Lock()
	paused := p.paused
	p.paused = false
	p.mu.Unlock()
	if !paused {
		return nil
	}
	return p.signal(syscall.SIGCONT)
}

// Kill sends SIGKILL and waits for the process to be reaped; it returns the exit
// status as proof.
func (p *Process) Kill(ctx context.Context) (string, error) {
	p.mu.Lock()
	p.stopping = true
	p.paused = false
	p.mu.Unlock()
	if err := p.signal(syscall.SIGKILL); err != nil {
		return "", err
	}
	select {
	case <-p.Exited():
	case <-ctx.Done():
		return "", fmt.Errorf("kill %s: %w", p.Name, ctx.Err())
	}
	st := p.ExitStatus()
	if !strings.Contains(st, "killed") {
		return "", fmt.Errorf("kill %s: exit status %q is not killed", p.Name, st)
	}
	return st, nil
}

// Stop asks the process to shut down gracefully (SIGTERM, after SIGCONT in case it is
// paused) and kills its process group if it has not exited within grace.
func (p *Process) Stop(grace time.Duration) error {
	if !p.Running() {
		return nil
	}
	p.mu.Lock()
	p.stopping = true
	p.mu.Unlock()
	_ = p.signal(syscall.SIGCONT)
	_ = p.signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.Exited():
		return nil
	case <-t.C:
	}
	pid := p.Pid()
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	<-p.Exited()
	return fmt.Errorf("%s (pid %d) did not stop within %s after SIGTERM; killed", p.Name, pid, grace)
}
