package probe

import (
	"context"
	"time"

	"github.com/proxyswitch/proxyswitch/internal/hooks"
)

// SetExitPage sets the HSCAN count of one exit_list.lua page and returns
// a function that restores the old one (tests read a large exit hash in
// many pages).
func SetExitPage(n int) (restore func()) {
	old := exitPage
	exitPage = n
	return func() { exitPage = old }
}

// SetLiftChunk sets how many proxies one site_hold.lua "lift" call takes
// and returns a function that restores the old count.
func SetLiftChunk(n int) (restore func()) {
	old := liftChunk
	liftChunk = n
	return func() { liftChunk = old }
}

// SpySiteHold calls spy with the mode and the number of IDs of every
// site_hold.lua call the checker makes, before it runs, and returns a
// function that stops spying. Not for concurrent tests.
func SpySiteHold(spy func(mode string, ids int)) (restore func()) {
	old := hooks.SiteHold
	hooks.SiteHold = func(ctx context.Context, sw any, mode, site string, ids []string, ttl time.Duration) ([]string, error) {
		spy(mode, len(ids))
		return old(ctx, sw, mode, site, ids, ttl)
	}
	return func() { hooks.SiteHold = old }
}

// ForgetExits forgets the recorded exits of ids, as a round does for
// proxies no longer in the pool (one exit_note.lua call).
func ForgetExits(ctx context.Context, c *Checker, ids ...string) error {
	var pairs []string
	for _, id := range ids {
		pairs = append(pairs, id, "")
	}
	_, err := c.noteExits(ctx, pairs...)
	return err
}
