package chaos

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// FaultType names one kind of fault the harness injects.
type FaultType string

// Fault types.
const (
	// FaultPause stops a worker process with SIGSTOP for longer than the lease, then
	// resumes it with SIGCONT: a GC pause or a stuck process.
	FaultPause FaultType = "pause"
	// FaultKill kills a worker process with SIGKILL and starts a new one in its slot.
	FaultKill FaultType = "kill"
	// FaultTerminate ends every database session of a worker with
	// pg_terminate_backend (found by application_name).
	FaultTerminate FaultType = "terminate"
	// FaultBlackhole makes the worker's proxy swallow every byte for longer than the
	// lease, then resets its connections (a partition that kills the TCP connections).
	FaultBlackhole FaultType = "blackhole"
	// FaultReset resets every connection of a worker at once (TCP RST).
	FaultReset FaultType = "reset"
	// FaultLatency adds latency to every chunk the worker's proxy forwards.
	FaultLatency FaultType = "latency"
	// FaultCommitDrop lets a COMMIT of the worker reach the server and drops the reply:
	// the worker cannot know whether its transaction landed.
	FaultCommitDrop FaultType = "commit-drop"
	// FaultPGRestart restarts PostgreSQL in immediate mode (a crash). Only when the
	// harness runs its own throwaway cluster.
	FaultPGRestart FaultType = "pg-restart"
	// FaultLinkDown brings a worker host's link down for longer than the lease, then up:
	// the host keeps running and must find its leases revoked. Hosts runs only.
	FaultLinkDown FaultType = "link-down"
	// FaultCommitCut cuts a worker host's link the moment the reply to one of its
	// COMMITs comes back, so the outcome is unknown on that host. Hosts runs only.
	FaultCommitCut FaultType = "commit-cut"
	// FaultDBPartition isolates the database host from every worker host for a few
	// seconds. Hosts runs only.
	FaultDBPartition FaultType = "db-partition"
	// FaultFailover kills the primary with COMMITs in flight and promotes the standby.
	// Failover runs only, once per run.
	FaultFailover FaultType = "failover"
)

// hostFaults need the multi-host network of EnvConfig.Hosts.
var hostFaults = []FaultType{FaultLinkDown, FaultCommitCut, FaultDBPartition}

// untargeted faults act on the database, not on one worker.
func untargeted(f FaultType) bool {
	return f == FaultPGRestart || f == FaultDBPartition || f == FaultFailover
}

// AllFaults lists every fault type in the order reports print them.
var AllFaults = []FaultType{FaultPause, FaultKill, FaultTerminate, FaultBlackhole, FaultReset,
	FaultLatency, FaultCommitDrop, FaultPGRestart, FaultLinkDown, FaultCommitCut, FaultDBPartition, FaultFailover}

// ParseFaults reads a comma-separated list of fault types; "all" means every one.
func ParseFaults(s string) ([]FaultType, error) {
	s = strings.TrimSpace(s)
	if s == "" || s == "all" {
		return slices.Clone(AllFaults), nil
	}
	if s == "none" {
		return []FaultType{}, nil
	}
	var out []FaultType
	for _, part := range strings.Split(s, ",") {
		f := FaultType(strings.TrimSpace(part))
		if !slices.Contains(AllFaults, f) {
			names := make([]string, len(AllFaults))
			for i, a := range AllFaults {
				names[i] = string(a)
			}
			return nil, fmt.Errorf("unknown fault %q: want a comma-separated list of %s, all or none",
				part, strings.Join(names, ", "))
		}
		if !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	return out, nil
}

// PlannedFault is one fault of a schedule.
type PlannedFault struct {
	Type FaultType `json:"type"`
	// At is when the fault starts, from the start of the workload.
	At time.Duration `json:"at"`
	// Worker is the target slot (0-based); unused by pg-restart.
	Worker int `json:"worker"`
	// For is how long a pause, blackhole or latency lasts.
	For time.Duration `json:"for,omitempty"`
	// Latency is the added latency of a latency fault.
	Latency time.Duration `json:"latency,omitempty"`
}

// String describes the fault for logs and the report: its type, when, and its target.
func (f PlannedFault) String() string {
	s := fmt.Sprintf("%s at %s", f.Type, f.At.Round(time.Millisecond))
	if !untargeted(f.Type) {
		s += fmt.Sprintf(" on w%d", f.Worker+1)
	}
	if f.For > 0 {
		s += fmt.Sprintf(" for %s", f.For.Round(time.Millisecond))
	}
	if f.Latency > 0 {
		s += fmt.Sprintf(" (+%s)", f.Latency)
	}
	return s
}

// PlanParams describes a random schedule.
type PlanParams struct {
	Seed    int64
	Faults  []FaultType
	Workers int
	// Duration: no fault starts after it.
	Duration time.Duration
	// Lease is the workers' lease; pauses and blackholes outlast it.
	Lease time.Duration
	// Gap is the mean pause between the end of one fault and the start of the next.
	// Defaults to Lease.
	Gap time.Duration
	// Start is when the first fault may start. Defaults to Lease (let work begin).
	Start time.Duration
}

// Plan draws a fault schedule from the seed: the same parameters always give the same
// schedule. Faults run one after another. Every fault type comes once, in a shuffled
// order, before any comes twice, so a run long enough for len(Faults) faults fires each
// type; Plan returns an error when Duration is too short for that.
func Plan(p PlanParams) ([]PlannedFault, error) {
	if len(p.Faults) == 0 {
		return []PlannedFault{}, nil
	}
	if p.Workers < 1 {
		return nil, fmt.Errorf("plan faults: workers %d must be at least 1", p.Workers)
	}
	if p.Lease <= 0 {
		return nil, fmt.Errorf("plan faults: lease %s must be positive", p.Lease)
	}
	if p.Gap <= 0 {
		p.Gap = p.Lease
	}
	if p.Start <= 0 {
		p.Start = p.Lease
	}
	rng := rand.New(rand.NewPCG(uint64(p.Seed), 0x6368616f73)) // "chaos"
	var out []PlannedFault
	at := p.Start
	var bag []FaultType
	for {
		if len(bag) == 0 {
			bag = slices.Clone(p.Faults)
			rng.Shuffle(len(bag), func(i, j int) { bag[i], bag[j] = bag[j], bag[i] })
		}
		f := PlannedFault{Type: bag[0], At: at, Worker: rng.IntN(p.Workers)}
		bag = bag[1:]
		switch f.Type {
		case FaultPause, FaultBlackhole, FaultLinkDown, FaultDBPartition:
			// Past the lease, by up to one more lease: the holder must lose the lease.
			f.For = p.Lease + p.Lease/2 + time.Duration(rng.Int64N(int64(p.Lease)))
		case FaultCommitCut:
			f.For = p.Lease/2 + time.Duration(rng.Int64N(int64(p.Lease/2)))
		case FaultLatency:
			f.For = p.Lease + time.Duration(rng.Int64N(int64(p.Lease)))
			f.Latency = time.Duration(50+rng.IntN(250)) * time.Millisecond
		}
		if f.At > p.Duration {
			break
		}
		out = append(out, f)
		// The next fault starts after this one ends (with the time its injection itself
		// takes) and a random gap.
		at = f.At + f.For + overhead(f.Type, p.Lease) + p.Gap/2 + time.Duration(rng.Int64N(int64(p.Gap)))
	}
	if len(out) < len(p.Faults) {
		return nil, fmt.Errorf("plan faults: %s is too short to fire each of the %d fault types once (got %d); lengthen the run",
			p.Duration, len(p.Faults), len(out))
	}
	return out, nil
}

// overhead estimates how long injecting a fault takes beyond its For: waiting for the
// target to hold a lease, restarting a process or the server, waiting for a COMMIT.
func overhead(f FaultType, lease time.Duration) time.Duration {
	switch f {
	case FaultPGRestart, FaultFailover:
		return 5 * time.Second
	case FaultKill, FaultCommitDrop:
		return lease / 2
	case FaultLinkDown:
		return 2*lease + time.Second // the wait for the worker to report its lost leases
	case FaultCommitCut:
		return lease + 3*time.Second // waiting for a COMMIT, then for its settlement
	case FaultDBPartition:
		return lease
	}
	return lease / 4
}

// FaultRecord is one fault the harness tried to inject, with its proof.
type FaultRecord struct {
	PlannedFault
	// Target names the worker process (or "postgres").
	Target string `json:"target"`
	// Started is when the injection began, from the start of the workload.
	Started time.Duration `json:"started"`
	// Took is how long the fault lasted, from its start to the end of the recovery.
	Took time.Duration `json:"took"`
	// Fired is true when the fault provably happened; Proof says how it is known.
	Fired bool   `json:"fired"`
	Proof string `json:"proof"`
	// Effect says what the fault set off, where the fault checks it (the lost leases a
	// cut-off worker reported, the commit it settled by looking).
	Effect string `json:"effect,omitempty"`
	// Err says why it did not fire.
	Err string `json:"error,omitempty"`
}

// MarshalJSON writes the durations of a planned fault as Go duration strings.
func (f PlannedFault) MarshalJSON() ([]byte, error) {
	return json.Marshal(plannedJSON{Type: f.Type, At: Duration(f.At), Worker: f.Worker,
		For: Duration(f.For), Latency: Duration(f.Latency)})
}

type plannedJSON struct {
	Type    FaultType `json:"type"`
	At      Duration  `json:"at"`
	Worker  int       `json:"worker"`
	For     Duration  `json:"for"`
	Latency Duration  `json:"latency"`
}

// faultRecordJSON is the JSON form of a FaultRecord.
type faultRecordJSON struct {
	plannedJSON
	Target  string   `json:"target"`
	Started Duration `json:"started"`
	Took    Duration `json:"took"`
	Fired   bool     `json:"fired"`
	Proof   string   `json:"proof"`
	Effect  string   `json:"effect,omitempty"`
	Err     string   `json:"error,omitempty"`
}

func (p plannedJSON) planned() PlannedFault {
	return PlannedFault{Type: p.Type, At: time.Duration(p.At), Worker: p.Worker,
		For: time.Duration(p.For), Latency: time.Duration(p.Latency)}
}

// UnmarshalJSON reads what MarshalJSON writes.
func (f *PlannedFault) UnmarshalJSON(b []byte) error {
	var p plannedJSON
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	*f = p.planned()
	return nil
}

// MarshalJSON writes a fault record with its durations as Go duration strings.
func (r FaultRecord) MarshalJSON() ([]byte, error) {
	return json.Marshal(faultRecordJSON{
		plannedJSON: plannedJSON{Type: r.Type, At: Duration(r.At), Worker: r.Worker, For: Duration(r.For), Latency: Duration(r.Latency)},
		Target:      r.Target, Started: Duration(r.Started), Took: Duration(r.Took), Fired: r.Fired, Proof: r.Proof, Effect: r.Effect, Err: r.Err})
}

// UnmarshalJSON reads what MarshalJSON writes (without it, the method promoted from
// PlannedFault would decode only the planned fields).
func (r *FaultRecord) UnmarshalJSON(b []byte) error {
	var v faultRecordJSON
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*r = FaultRecord{PlannedFault: v.planned(), Target: v.Target, Started: time.Duration(v.Started),
		Took: time.Duration(v.Took), Fired: v.Fired, Proof: v.Proof, Effect: v.Effect, Err: v.Err}
	return nil
}
