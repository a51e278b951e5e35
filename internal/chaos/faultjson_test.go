package chaos

import (
	"encoding/json"
	"testing"
	"time"
)

// Reports are read back by tools and tests: a fault record survives a JSON round trip.
func TestFaultRecordJSONRoundTrip(t *testing.T) {
	t.Parallel()
	in := FaultRecord{PlannedFault: PlannedFault{Type: FaultPause, At: 1500 * time.Millisecond, Worker: 2, For: 3 * time.Second},
		Target: "w2", Started: 1600 * time.Millisecond, Took: 3100 * time.Millisecond, Fired: true, Proof: "state T"}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var out FaultRecord
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("unmarshal %s: %v", b, err)
	}
	if out != in {
		t.Fatalf("round trip: got %+v, want %+v (json %s)", out, in, b)
	}
}
