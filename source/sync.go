package source

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/proxyswitch/proxyswitch"
	"github.com/proxyswitch/proxyswitch/internal/hooks"
)

// DefaultEvery is how often a Syncer polls its source unless told.
const DefaultEvery = 5 * time.Minute

// DefaultMinFraction is the shrink guard's threshold unless told: a list
// with fewer than half the pool's proxies is refused.
const DefaultMinFraction = 0.5

// ErrGuard marks a list the shrink guard refused (see Syncer.MinFraction).
var ErrGuard = errors.New("source: refused by the shrink guard")

// Result is what one sync did.
type Result struct {
	Source  string    // the source, as its String names it
	At      time.Time // when the sync started
	Fetched int       // proxies the source returned (valid, distinct)
	Before  int       // proxies in the pool before (0 if the sync failed before it read the pool)
	Added   int       // proxies added
	Removed int       // proxies removed
	Size    int       // proxies in the pool after (Before when nothing was written, 0 if unread)
	Written bool      // the pool was changed (one replace: atomic up to 500 proxies, see Syncer)
	// Err is why the sync did nothing: the source failed (its error,
	// redacted), Redis failed, or the guard refused the list (ErrGuard).
	// A replace of more than 500 proxies that Redis failed part way may
	// have applied its first steps (see Syncer).
	Err error
}

// Syncer keeps a Switch's pool equal to a Source's list. Each sync fetches
// the list and compares it with the pool (the root's diff, through internal/hooks: proxies by ID and
// labels, a gateway template by template, session count and labels, not by
// the session ids each fetch draws anew); when they differ it replaces the
// pool with the list (Switch.ReplaceProxies: proxies kept keep their
// leases, cooldowns and bans), and when they do not it writes nothing. A
// failed fetch or a refused list never changes the pool: the proxies it
// holds keep serving.
//
// The replace is atomic when the pool and the list hold at most 500
// proxies each: workers see the old set or the new one. A larger one is
// several calls (see Switch.Replace): until it ends, workers may see the
// old set shrink to the proxies both share (to none if they share none),
// then grow to the new one; a replace that fails part way leaves such a
// set, which the next sync completes.
//
// The guard: a list that is empty while the pool is not, or holds fewer
// than MinFraction of the pool's proxies, is refused (Result.Err wraps
// ErrGuard) unless NoGuard is set: a provider's API that answers an empty
// or truncated list in a bad minute does not wipe the pool. A deliberate
// shrink is done with NoGuard, or by hand (proxyswitch load).
//
// Set the fields before the first sync and do not change them after. Sync
// and Run are safe for concurrent use (syncs are serialised). Several
// processes may sync one pool of up to 500 proxies; sync a larger pool
// from one process at a time (two large replaces at once may interleave).
type Syncer struct {
	Switch *proxyswitch.Switch
	Source Source
	// Every is the interval of Run; 0 is DefaultEvery.
	Every time.Duration
	// MinFraction is the guard's threshold, in (0, 1]; 0 is
	// DefaultMinFraction.
	MinFraction float64
	// NoGuard lets any list through, an empty one included.
	NoGuard bool
	// Logger gets one line per sync that changed something (info) or
	// failed (warn); nil is slog.Default(). Nothing logged holds a secret.
	Logger *slog.Logger
	// OnSync, when set, is called with the Result of every sync, from the
	// goroutine that ran it.
	OnSync func(Result)

	mu sync.Mutex
}

// Sync runs one sync now. Its error is Result.Err.
func (s *Syncer) Sync(ctx context.Context) (Result, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.sync(ctx)
	log := s.Logger
	if log == nil {
		log = slog.Default()
	}
	switch {
	case r.Err != nil:
		log.Warn("proxyswitch source: sync failed, pool unchanged", "source", r.Source, "pool", s.poolName(),
			"fetched", r.Fetched, "size", r.Size, "err", r.Err.Error())
	case r.Written:
		log.Info("proxyswitch source: pool updated", "source", r.Source, "pool", s.poolName(),
			"added", r.Added, "removed", r.Removed, "size", r.Size)
	}
	if s.OnSync != nil {
		s.OnSync(r)
	}
	return r, r.Err
}

func (s *Syncer) poolName() string {
	if s.Switch == nil {
		return ""
	}
	return s.Switch.Pool()
}

func (s *Syncer) sync(ctx context.Context) Result {
	r := Result{At: time.Now()}
	if s.Source == nil || s.Switch == nil {
		r.Err = fmt.Errorf("%w: source: Syncer needs a Switch and a Source", proxyswitch.ErrConfig)
		return r
	}
	r.Source = s.Source.String()
	if err := s.check(); err != nil {
		r.Err = err
		return r
	}
	ps, err := s.Source.Fetch(ctx)
	if err != nil {
		r.Err = err
		return r
	}
	r.Fetched = len(ps)
	d, err := hooks.Diff(ctx, s.Switch, ps)
	if err != nil {
		r.Err = err
		return r
	}
	r.Before, r.Size = d.Size, d.Size
	if !d.Changed() {
		return r
	}
	if !s.NoGuard && d.Size > 0 {
		frac := s.MinFraction
		if frac == 0 {
			frac = DefaultMinFraction
		}
		if len(ps) == 0 || float64(len(ps)) < frac*float64(d.Size) {
			r.Err = fmt.Errorf("%w: %s returned %d proxies for a pool of %d (the guard wants at least %.0f%%)",
				ErrGuard, r.Source, len(ps), d.Size, frac*100)
			return r
		}
	}
	ch, err := s.Switch.ReplaceProxies(ctx, ps)
	if err != nil {
		r.Err = err
		return r
	}
	r.Written = true
	r.Added, r.Removed, r.Size = ch.Added, ch.Removed, ch.Size
	return r
}

func (s *Syncer) check() error {
	if !(s.MinFraction >= 0 && s.MinFraction <= 1) { // NaN too
		return fmt.Errorf("%w: source: MinFraction %v not in (0, 1]", proxyswitch.ErrConfig, s.MinFraction)
	}
	if s.Every < 0 {
		return fmt.Errorf("%w: source: negative interval %v", proxyswitch.ErrConfig, s.Every)
	}
	return nil
}

// Run syncs at once, then every Every, until ctx ends; it returns ctx's
// error then, or at once a configuration error. A failed sync is logged
// and reported (OnSync) and the next one comes at the next tick: Run never
// stops for a source's or Redis' failure.
func (s *Syncer) Run(ctx context.Context) error {
	if s.Source == nil || s.Switch == nil {
		return fmt.Errorf("%w: source: Syncer needs a Switch and a Source", proxyswitch.ErrConfig)
	}
	if err := s.check(); err != nil {
		return err
	}
	every := s.Every
	if every == 0 {
		every = DefaultEvery
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		_, _ = s.Sync(ctx)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
