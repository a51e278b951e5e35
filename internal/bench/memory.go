package bench

import (
	"bufio"
	"bytes"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// memSampleEvery is how often a memory sampler reads the process's memory while jobs
// run.
const memSampleEvery = 20 * time.Millisecond

// minRunningForMemory is the fewest jobs running at once for which a run reports memory
// per 1,000 running jobs: with fewer, the process's own noise (pool buffers, the
// collector's pacing) would be most of the figure.
const minRunningForMemory = 100

// memSample is the process's memory at one moment.
type memSample struct {
	rss uint64 // resident set size (VmRSS), bytes; 0 when unknown
	goB uint64 // bytes of heap objects (live or not yet swept) and goroutine stacks
}

// goMemMetrics are the runtime/metrics a sample adds up.
var goMemMetrics = []string{"/memory/classes/heap/objects:bytes", "/memory/classes/heap/stacks:bytes"}

func sampleMemory(buf []metrics.Sample) memSample {
	for i, name := range goMemMetrics {
		buf[i].Name = name
	}
	metrics.Read(buf)
	var s memSample
	for _, m := range buf {
		if m.Value.Kind() == metrics.KindUint64 {
			s.goB += m.Value.Uint64()
		}
	}
	s.rss = readRSS()
	return s
}

// readRSS returns VmRSS of /proc/self/status in bytes, 0 where there is none.
func readRSS() uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.HasPrefix(line, []byte("VmRSS:")) {
			continue
		}
		f := bytes.Fields(line[len("VmRSS:"):])
		if len(f) < 1 {
			return 0
		}
		kb, err := strconv.ParseUint(string(f[0]), 10, 64)
		if err != nil {
			return 0
		}
		return kb << 10
	}
	return 0
}

// memWatch samples the process's memory while a side works jobs and keeps the sample
// taken when the most jobs were running (started, not yet reported completed).
//
// When it is precise, it collects garbage before it samples a new peak (at most once
// per tenth more jobs running, or once the number holds still), so that the Go figure
// is what the running jobs keep live, not what the collector has yet to sweep.
// Collections cost the side CPU time, so only runs whose jobs sleep (Config.JobSleep)
// are precise, and only they report memory per running job.
type memWatch struct {
	// started and returned count the handlers that began and returned: the jobs
	// running are those between, whatever the completions written since.
	started  atomic.Int64
	returned atomic.Int64
	base     memSample
	precise  bool
	gcAt     int64 // running jobs at the last collection

	stop chan struct{}
	wg   sync.WaitGroup

	peakRunning int64
	atPeak      memSample
	maxRSS      uint64
}

// startMemWatch returns the process's memory to the operating system, takes the base
// sample, and starts sampling.
func startMemWatch(precise bool) *memWatch {
	// Collected and returned first, so that what the previous phase (the prefill, the
	// other side's run) left behind is not counted as this run's.
	debug.FreeOSMemory()
	w := &memWatch{precise: precise, stop: make(chan struct{})}
	buf := make([]metrics.Sample, len(goMemMetrics))
	w.base = sampleMemory(buf)
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		t := time.NewTicker(memSampleEvery)
		defer t.Stop()
		var prev int64 // running jobs at the last tick
		for {
			select {
			case <-w.stop:
				return
			case <-t.C:
			}
			running := w.started.Load() - w.returned.Load()
			if !w.precise {
				s := sampleMemory(buf)
				w.maxRSS = max(w.maxRSS, s.rss)
				if running > w.peakRunning {
					w.peakRunning, w.atPeak = running, s
				}
				continue
			}
			// A new peak is sampled after a collection, when it grew by a tenth since the
			// last one or held since the last tick (a plateau), and only if no job
			// started or finished during the collection.
			grew := running*10 >= w.gcAt*11 || running == prev
			prev = running
			if running >= minRunningForMemory && running > w.peakRunning && running != w.gcAt && grew {
				runtime.GC()
				w.gcAt = running
				if w.started.Load()-w.returned.Load() == running {
					s := sampleMemory(buf)
					w.maxRSS = max(w.maxRSS, s.rss)
					w.peakRunning, w.atPeak = running, s
					continue
				}
			}
			w.maxRSS = max(w.maxRSS, readRSS())
		}
	}()
	return w
}

// end stops sampling and adds the memory figures to m: the peak of running jobs and
// the resident set at its highest, and, when enough jobs ran at once, the growth of the
// resident set and of the Go heap and stacks per 1,000 running jobs, from the base
// sample to the sample at the peak of running jobs.
func (w *memWatch) end(m map[string]float64) {
	close(w.stop)
	w.wg.Wait()
	m[MetricPeakRunning] = float64(w.peakRunning)
	if w.maxRSS > 0 {
		m[MetricRSSPeakMB] = float64(w.maxRSS) / (1 << 20)
	}
	if !w.precise || w.peakRunning < minRunningForMemory {
		return
	}
	per1k := func(at, base uint64) float64 {
		return (float64(at) - float64(base)) / (1 << 20) / (float64(w.peakRunning) / 1000)
	}
	if w.atPeak.rss > 0 && w.base.rss > 0 {
		m[MetricRSSPer1kRunning] = per1k(w.atPeak.rss, w.base.rss)
	}
	m[MetricGoMemPer1kRunning] = per1k(w.atPeak.goB, w.base.goB)
}

// allocCount is the process's heap allocations so far: objects and bytes.
type allocCount struct{ objects, bytes uint64 }

func readAllocs() allocCount {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return allocCount{objects: ms.Mallocs, bytes: ms.TotalAlloc}
}
