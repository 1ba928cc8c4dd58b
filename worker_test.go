package proxyswitch

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gocolly/colly/v2"
	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/proxyswitch/proxyswitch/internal/reexec"
)

// Worker processes: the test binary re-executed with workerEnv set runs one
// crawler (or lease holder) against the Redis, sites and proxies of the
// parent test, as a separate OS process with its own Redis client.

const workerEnv = "PROXYSWITCH_TEST_WORKER"

type workerSpec struct {
	Mode      string   `json:"mode"`  // "crawl" or "hold"
	Redis     string   `json:"redis"` // shared.Addr(): an address, or a cluster's addresses separated by commas
	Prefix    string   `json:"prefix"`
	URLs      []string `json:"urls"`    // crawl: the URLs to visit
	Threads   int      `json:"threads"` // crawl: parallel requests
	Task      string   `json:"task"`    // crawl: the task every URL belongs to, visited in order (session_test.go); "" for none
	LeaseTTL  string   `json:"lease_ttl"`
	HoldSites []string `json:"hold_sites"` // hold: lease one proxy per site, then sleep; probe: the site
	Until     int64    `json:"until"`      // probe: lease and release until this unix ms
	// AttemptTimeout and MaxWait, when set, are the Switch's (lostpool_test.go).
	AttemptTimeout string `json:"attempt_timeout"`
	MaxWait        string `json:"max_wait"`
}

type workerResult struct {
	OK, Failed int
	IDs        map[string]int // probe: leases per proxy ID
	Shots      []stormShot    // storm: every request made (breaker_test.go)
}

// startWorker returns the command of one worker process; its standard
// error goes to the test's.
func startWorker(t *testing.T, spec workerSpec) *exec.Cmd {
	t.Helper()
	cmd := reexec.Command(t, workerEnv, spec)
	cmd.Stderr = os.Stderr
	return cmd
}

// workerMain is a worker process (TestMain runs it through reexec.Main).
func workerMain(spec workerSpec) int {
	rdb := redistest.NewClient(spec.Redis)
	defer rdb.Close()
	ttl, _ := time.ParseDuration(spec.LeaseTTL)
	if ttl == 0 {
		ttl = 30 * time.Second
	}
	// A generous Redis bound: these workers test collisions and crash
	// recovery, not timeouts, and CI machines can be loaded.
	opts := []Option{WithPrefix(spec.Prefix), WithTimeouts(Timeouts{LeaseTTL: ttl, Redis: 10 * time.Second})}
	orOff := func(d time.Duration) time.Duration { // a zero field would keep the default
		if d == 0 {
			return Off
		}
		return d
	}
	if d, err := time.ParseDuration(spec.AttemptTimeout); err == nil {
		opts = append(opts, WithTimeouts(Timeouts{Attempt: orOff(d)}))
	}
	if d, err := time.ParseDuration(spec.MaxWait); err == nil {
		opts = append(opts, WithTimeouts(Timeouts{MaxWait: orOff(d)}))
	}
	sw, err := NewSwitch(rdb, opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 2
	}
	switch spec.Mode {
	case "hold":
		for _, site := range spec.HoldSites {
			if _, err := sw.Lease(context.Background(), site); err != nil {
				fmt.Fprintln(os.Stderr, "worker:", err)
				return 2
			}
		}
		fmt.Println("held")
		time.Sleep(time.Hour)
		return 0
	case "probe":
		res := workerResult{IDs: map[string]int{}}
		for time.Now().UnixMilli() < spec.Until {
			l, err := sw.Lease(context.Background(), spec.HoldSites[0])
			if err != nil {
				fmt.Fprintln(os.Stderr, "worker:", err)
				return 2
			}
			res.IDs[l.Proxy().ID()]++
			_ = l.Release(context.Background())
		}
		b, _ := json.Marshal(res)
		fmt.Println(string(b))
		return 0
	case "storm": // breaker_test.go: Threads workers on URLs[0] until Until
		c := colly.NewCollector(colly.AllowURLRevisit())
		sw.Attach(c)
		res := workerResult{Shots: stormLoop(c, spec.URLs[0], spec.Threads, time.UnixMilli(spec.Until), spec.Prefix+"w"+spec.Task)}
		b, _ := json.Marshal(res)
		fmt.Println(string(b))
		return 0
	case "crawl":
		c := colly.NewCollector(colly.Async(spec.Task == ""), colly.AllowURLRevisit())
		sw.Attach(c)
		if err := c.Limit(&colly.LimitRule{DomainGlob: "*", Parallelism: spec.Threads}); err != nil {
			fmt.Fprintln(os.Stderr, "worker:", err)
			return 2
		}
		var res workerResult
		var ok, failed atomic.Int64
		c.OnResponse(func(*colly.Response) { ok.Add(1) })
		c.OnError(func(_ *colly.Response, err error) {
			failed.Add(1)
			fmt.Fprintln(os.Stderr, "worker request failed:", err)
		})
		for _, u := range spec.URLs {
			if spec.Task != "" {
				_ = c.Request("GET", u, nil, NewTaskContext(spec.Task), nil)
				continue
			}
			_ = c.Visit(u)
		}
		c.Wait()
		res.OK, res.Failed = int(ok.Load()), int(failed.Load())
		b, _ := json.Marshal(res)
		fmt.Println(string(b))
		return 0
	}
	fmt.Fprintln(os.Stderr, "worker: unknown mode", spec.Mode)
	return 2
}

func parseWorkerResult(out []byte) (workerResult, error) {
	var r workerResult
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	err := json.Unmarshal([]byte(lines[len(lines)-1]), &r)
	return r, err
}
