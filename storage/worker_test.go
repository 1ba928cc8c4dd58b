package storage

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/gocolly/colly/v2"
	"github.com/gocolly/colly/v2/queue"
	"github.com/proxyswitch/proxyswitch/internal/redistest"
	"github.com/proxyswitch/proxyswitch/internal/reexec"
)

// Worker processes: the test binary re-executed with workerEnv set runs one
// queue-driven collector against the parent test's Redis and site, as a
// separate OS process with its own Redis client, until the namespace's
// queue is drained.

const workerEnv = "PROXYSWITCH_STORAGE_TEST_WORKER"

type workerSpec struct {
	Redis         string        `json:"redis"` // address, or a cluster's addresses separated by commas
	Namespace     string        `json:"namespace"`
	Threads       int           `json:"threads"`
	Visibility    time.Duration `json:"visibility"`
	MaxDeliveries int           `json:"max_deliveries"`
	RetryDelay    time.Duration `json:"retry_delay"`
	PollInterval  time.Duration `json:"poll_interval"`
	// Record, if set, is a file to which the worker's own OnScraped
	// callback, registered after Attach, appends each scraped URL (one
	// write per URL, after HookDelay of "processing"): the user's record
	// that an acknowledgement must not overtake.
	Record    string        `json:"record,omitempty"`
	HookDelay time.Duration `json:"hook_delay,omitempty"`
}

func (w workerSpec) options() []Option {
	return []Option{
		WithNamespace(w.Namespace), WithVisibilityTimeout(w.Visibility), WithMaxDeliveries(w.MaxDeliveries),
		WithRetryDelay(w.RetryDelay), WithPollInterval(w.PollInterval),
	}
}

// workerCmd returns the command of one worker process; its output goes to
// out.
func workerCmd(t *testing.T, spec workerSpec, out *bytes.Buffer) *exec.Cmd {
	t.Helper()
	cmd := reexec.Command(t, workerEnv, spec)
	cmd.Stdout, cmd.Stderr = out, out
	return cmd
}

// workerMain is a worker process (TestMain runs it through reexec.Main).
func workerMain(spec workerSpec) int {
	rdb := redistest.NewClient(spec.Redis)
	defer rdb.Close()
	s, err := New(rdb, spec.options()...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 2
	}
	c := colly.NewCollector() // revisits off: the visited set is shared too
	if err := c.SetStorage(s); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 2
	}
	s.Attach(c)
	if spec.Record != "" {
		f, err := os.OpenFile(spec.Record, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err != nil {
			fmt.Fprintln(os.Stderr, "worker:", err)
			return 2
		}
		defer f.Close()
		c.OnScraped(func(r *colly.Response) {
			time.Sleep(spec.HookDelay)
			if _, err := f.WriteString(r.Request.URL.String() + "\n"); err != nil {
				fmt.Fprintln(os.Stderr, "worker: recording:", err)
			}
		})
	}
	q, err := queue.New(spec.Threads, s)
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 2
	}
	if err := q.Run(c); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	fmt.Println("worker: queue drained")
	return 0
}
