package chaos

import (
	"bytes"
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseFaults(t *testing.T) {
	t.Parallel()
	all, err := ParseFaults("all")
	if err != nil || !reflect.DeepEqual(all, AllFaults) {
		t.Fatalf("ParseFaults(all) = %v, %v", all, err)
	}
	got, err := ParseFaults(" pause,kill , pause")
	if err != nil || !reflect.DeepEqual(got, []FaultType{FaultPause, FaultKill}) {
		t.Fatalf("ParseFaults = %v, %v; want [pause kill]", got, err)
	}
	if none, err := ParseFaults("none"); err != nil || len(none) != 0 {
		t.Fatalf("ParseFaults(none) = %v, %v", none, err)
	}
	if _, err := ParseFaults("pause,gc"); err == nil || !strings.Contains(err.Error(), `unknown fault "gc"`) {
		t.Fatalf("ParseFaults(pause,gc) error = %v; want one naming gc", err)
	}
}

func TestPlanIsSeededAndCoversEveryType(t *testing.T) {
	t.Parallel()
	p := PlanParams{Seed: 99, Faults: AllFaults, Workers: 3, Duration: 2 * time.Minute, Lease: 2 * time.Second}
	a, err := Plan(p)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Plan(p)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("the same seed gave two schedules")
	}
	p.Seed = 100
	if c, _ := Plan(p); reflect.DeepEqual(a, c) {
		t.Fatal("two seeds gave the same schedule")
	}
	// Every type once before any type twice; one at a time; pauses outlast the lease.
	first := map[FaultType]bool{}
	for _, f := range a[:len(AllFaults)] {
		first[f.Type] = true
	}
	if len(first) != len(AllFaults) {
		t.Fatalf("the first %d faults are not one of each type: %v", len(AllFaults), a[:len(AllFaults)])
	}
	for i, f := range a {
		if f.At > p.Duration || f.Worker < 0 || f.Worker >= p.Workers {
			t.Fatalf("fault %d out of range: %s", i, f)
		}
		if i > 0 && f.At < a[i-1].At+a[i-1].For {
			t.Fatalf("fault %d (%s) starts before fault %d (%s) ends", i, f, i-1, a[i-1])
		}
		if (f.Type == FaultPause || f.Type == FaultBlackhole) && f.For <= p.Lease {
			t.Fatalf("%s does not outlast the lease %s", f, p.Lease)
		}
	}
	p.Duration = 5 * time.Second
	if _, err := Plan(p); err == nil {
		t.Fatal("a run too short for one fault of each type was planned")
	}
}

func TestProcState(t *testing.T) {
	t.Parallel()
	st, err := ProcState(1)
	if err != nil || !slices.Contains([]string{"R", "S", "D", "I"}, st) {
		t.Fatalf("ProcState(1) = %q, %v", st, err)
	}
}

// TestRunWithoutFaults is the control: the workload alone passes and every figure adds
// up.
func TestRunWithoutFaults(t *testing.T) {
	t.Parallel()
	rep := runChaos(t, Config{
		Env:      EnvConfig{Workers: 2},
		Workload: WorkloadConfig{Customers: 10, OrderKeys: 4, SleepJobs: 2},
		Seed:     1, Duration: 3 * time.Second, Faults: []FaultType{},
	})
	requirePass(t, rep)
	s := rep.Workload
	if rep.Invoices.Rows != int64(s.Customers) || s.BillingJobs != int64(s.Customers) {
		t.Fatalf("%d invoices and %d invoice jobs for %d customers", rep.Invoices.Rows, s.BillingJobs, s.Customers)
	}
	if rep.Orders.Rows != int64(s.OrderKeys) || s.HTTPCreated+s.HTTPReplayed < int64(s.OrderKeys) {
		t.Fatalf("%d orders for %d keys; %d created, %d replayed", rep.Orders.Rows, s.OrderKeys, s.HTTPCreated, s.HTTPReplayed)
	}
	if rep.SleepFirstAttempt != int64(s.SleepJobs) {
		t.Fatalf("%d of %d sleep jobs longer than the lease completed on their first attempt", rep.SleepFirstAttempt, s.SleepJobs)
	}
	if rep.Outbox.Delivered != rep.Invoices.Rows+rep.Orders.Rows || rep.Emails.Lines != rep.Outbox.Delivered {
		t.Fatalf("%d outbox rows delivered, %d emails received, for %d invoices and %d orders",
			rep.Outbox.Delivered, rep.Emails.Lines, rep.Invoices.Rows, rep.Orders.Rows)
	}
	if rep.Revocations != 0 || rep.StaleWritesRejected != 0 {
		t.Fatalf("without faults: %d revocations, %d stale writes; want none", rep.Revocations, rep.StaleWritesRejected)
	}
}

func TestFaultRecordJSON(t *testing.T) {
	t.Parallel()
	rec := FaultRecord{PlannedFault: PlannedFault{Type: FaultPause, At: 1500 * time.Millisecond, Worker: 1, For: 3 * time.Second},
		Target: "w2", Started: 1600 * time.Millisecond, Took: 3100 * time.Millisecond, Fired: true, Proof: "state T"}
	b, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"type":"pause","at":"1.5s","worker":1,"for":"3s","latency":"0s","target":"w2","started":"1.6s","took":"3.1s","fired":true,"proof":"state T"}`
	if string(b) != want {
		t.Fatalf("JSON of a fault record:\n got %s\nwant %s", b, want)
	}
}

// TestReportNamesAnExtendedFaultPhase: the text report gives the fault phase as it ran,
// and says so when a late fault made it longer than planned.
func TestReportNamesAnExtendedFaultPhase(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		phase time.Duration
		want  string
	}{
		{10 * time.Second, "faults for 10s, settled"},
		{13500 * time.Millisecond, "faults for 13.5s (planned 10s; a late fault extended it), settled"},
	} {
		rep := &Report{Mode: "fenced", Duration: Duration(10 * time.Second), FaultPhase: Duration(c.phase)}
		var buf bytes.Buffer
		if err := rep.WriteText(&buf); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(buf.String(), c.want) {
			t.Errorf("report of a %s phase:\n%s\nwant it to contain %q", c.phase, buf.String(), c.want)
		}
	}
}
