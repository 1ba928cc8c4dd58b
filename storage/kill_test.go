package storage

import (
	"bytes"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/gocolly/colly/v2/queue"
	"github.com/stretchr/testify/require"
)

// A 10,000-URL queue crawl by two worker processes, one of which is
// SIGKILLed and restarted every 1-2 seconds: every URL is fetched at least
// once, the duplicates are no more than the requests in flight at the
// kills, the queue and in-flight set end empty, and the poison URL (always
// 500) ends in the dead-letter list after its last delivery.
func TestKilledWorkerProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("crawls 10,000 URLs with worker processes")
	}
	const urls = 10000
	site := newCountingSite(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/poison" {
			http.Error(w, "poison", http.StatusInternalServerError)
			return
		}
		time.Sleep(10 * time.Millisecond)
		fmt.Fprint(w, "<html><body>ok</body></html>")
	})
	spec := workerSpec{
		Redis: shared.Addr(), Namespace: testNS(), Threads: 16,
		Visibility: 2 * time.Second, MaxDeliveries: 3, RetryDelay: 200 * time.Millisecond,
		PollInterval: 20 * time.Millisecond,
	}
	s := newStorage(t, shared.Client(t), spec.options()...)
	q, err := queue.New(1, s)
	require.NoError(t, err)
	require.NoError(t, q.AddURL(site.URL+"/poison"))
	for i := range urls {
		require.NoError(t, q.AddURL(fmt.Sprintf("%s/p/%d", site.URL, i)))
	}

	type worker struct {
		cmd  *exec.Cmd
		out  *bytes.Buffer
		done chan error
	}
	start := func() *worker {
		w := &worker{out: &bytes.Buffer{}, done: make(chan error, 1)}
		w.cmd = workerCmd(t, spec, w.out)
		require.NoError(t, w.cmd.Start())
		go func() { w.done <- w.cmd.Wait() }()
		return w
	}
	var logs []*bytes.Buffer
	defer func() {
		if t.Failed() {
			for i, l := range logs {
				t.Logf("worker output %d:\n%s", i, lastLines(l.String(), 20))
			}
		}
	}()
	began := time.Now()
	stable, victim := start(), start()
	logs = append(logs, stable.out, victim.out)
	t.Cleanup(func() {
		for _, w := range []*worker{stable, victim} {
			_ = w.cmd.Process.Kill()
		}
	})

	kills, inFlightAtKills := 0, 0
	pauses := []time.Duration{1200 * time.Millisecond, 1700 * time.Millisecond, 1000 * time.Millisecond, 1500 * time.Millisecond}
killing:
	for {
		select {
		case err := <-stable.done:
			require.NoError(t, err, "stable worker")
			stable.done <- nil
			break killing
		case <-time.After(pauses[kills%len(pauses)]):
		}
		st, err := s.Stats(bg)
		require.NoError(t, err)
		if st.Ready == 0 {
			break // nothing left to hand out: let the victim finish
		}
		require.NoError(t, victim.cmd.Process.Kill()) // SIGKILL
		<-victim.done
		kills++
		inFlightAtKills += st.InFlight
		victim = start()
		logs = append(logs, victim.out)
	}
	for name, w := range map[string]*worker{"stable": stable, "victim": victim} {
		select {
		case err := <-w.done:
			require.NoError(t, err, name)
		case <-time.After(90 * time.Second):
			t.Fatalf("%s worker did not finish", name)
		}
	}
	elapsed := time.Since(began)

	missing, dups := 0, 0
	for i := range urls {
		switch n := site.count(fmt.Sprintf("/p/%d", i)); {
		case n == 0:
			missing++
		case n > 1:
			dups += n - 1
		}
	}
	t.Logf("%d URLs in %v, %d kills, %d requests in flight at the kills, %d fetched twice, poison fetched %d times",
		urls, elapsed.Round(time.Millisecond), kills, inFlightAtKills, dups, site.count("/poison"))
	require.GreaterOrEqual(t, kills, 2, "the crawl ended before the victim was killed twice")
	require.Zero(t, missing, "URLs never fetched")
	require.LessOrEqual(t, dups, inFlightAtKills)
	st, err := s.Stats(bg)
	require.NoError(t, err)
	require.Equal(t, Stats{Dead: 1}, st)
	dl, err := s.DeadLetters(bg, 0, 10)
	require.NoError(t, err)
	require.Len(t, dl, 1)
	require.Equal(t, site.URL+"/poison", dl[0].URL)
	require.Equal(t, 3, dl[0].Deliveries)
	require.GreaterOrEqual(t, site.count("/poison"), 1)
	require.LessOrEqual(t, site.count("/poison"), 3)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// Issue 13, item 5: a worker process whose own OnScraped callback,
// registered after Attach, records each page (after 20ms of processing) is
// SIGKILLed 20 times mid-crawl, then a last worker drains the queue. No URL
// is lost: every URL the queue let go of (all of them, once it is empty)
// was recorded by a worker's hook. An acknowledgement that ran before the
// user's callback would lose the pages in that callback at each kill.
func TestKilledWorkerLosesNoScrapedPage(t *testing.T) {
	if testing.Short() {
		t.Skip("kills worker processes 20 times")
	}
	const urls, kills = 3000, 20
	site := newCountingSite(t, func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "<html><body>ok</body></html>")
	})
	dir := t.TempDir()
	spec := workerSpec{
		Redis: shared.Addr(), Namespace: testNS(), Threads: 8,
		Visibility: time.Second, MaxDeliveries: 1000, RetryDelay: 50 * time.Millisecond,
		PollInterval: 20 * time.Millisecond, HookDelay: 20 * time.Millisecond,
	}
	s := newStorage(t, shared.Client(t), spec.options()...)
	want := make([]string, urls)
	for i := range want {
		want[i] = fmt.Sprintf("%s/p/%d", site.URL, i)
	}
	_, err := s.AddURLs(bg, want...)
	require.NoError(t, err)

	run := func(i int, kill bool) {
		spec := spec
		spec.Record = fmt.Sprintf("%s/record-%d", dir, i)
		out := &bytes.Buffer{}
		cmd := workerCmd(t, spec, out)
		require.NoError(t, cmd.Start())
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		if !kill {
			select {
			case err := <-done:
				require.NoError(t, err, "last worker:\n%s", lastLines(out.String(), 20))
			case <-time.After(2 * time.Minute):
				_ = cmd.Process.Kill()
				t.Fatalf("last worker did not finish:\n%s", lastLines(out.String(), 20))
			}
			return
		}
		// Kill once the worker has recorded a few pages: its threads are
		// then busy in the hook.
		deadline := time.Now().Add(30 * time.Second)
		for {
			b, _ := os.ReadFile(spec.Record)
			if bytes.Count(b, []byte("\n")) >= 20 || time.Now().After(deadline) {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		require.NoError(t, cmd.Process.Kill()) // SIGKILL
		<-done
	}
	for i := range kills {
		run(i, true)
	}
	run(kills, false)

	recorded := map[string]int{}
	for i := range kills + 1 {
		b, err := os.ReadFile(fmt.Sprintf("%s/record-%d", dir, i))
		require.NoError(t, err)
		for _, u := range strings.Fields(string(b)) {
			recorded[u]++
		}
	}
	var lost []string
	for _, u := range want {
		if recorded[u] == 0 {
			lost = append(lost, u)
		}
	}
	st, err := s.Stats(bg)
	require.NoError(t, err)
	require.Equal(t, Stats{}, st, "the queue is not empty: every URL must have been acknowledged")
	t.Logf("%d URLs, %d kills, %d recorded twice or more, %d lost", urls, kills, countOver(recorded, 1), len(lost))
	require.Empty(t, lost[:min(len(lost), 10)], "%d URLs acknowledged but never recorded by the user's OnScraped callback (first 10 shown)", len(lost))
}

func countOver(m map[string]int, n int) int {
	c := 0
	for _, v := range m {
		if v > n {
			c++
		}
	}
	return c
}
